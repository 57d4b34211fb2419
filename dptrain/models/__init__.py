"""What is trained: the objectives (loss, metrics, output kind), the networks, the optimisers and
the non-private baselines."""
