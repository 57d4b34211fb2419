"""The tasks: one module per ``task=`` value, each with its ``run_task(cfg, run_dir=...)``. Nothing
imports this package but the command line (:mod:`dptrain.tasks.cli`, the ``TASKS`` registry)."""
