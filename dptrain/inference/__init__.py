"""Statistical inference for linear models under differential privacy (docs/inference.md).

* :mod:`dptrain.inference.coefficients`: the original-scale, reference-coded coefficient table
  of one fitted linear model (a linear map of its weights, from the public schema only);
* :mod:`dptrain.inference.intervals`: subsample-and-aggregate's t interval, the table's format;
* :mod:`dptrain.inference.subsample`: DP-SGD on K disjoint, row-keyed parts (parallel composition);
* :mod:`dptrain.inference.ssp`: noisy sufficient statistics for linear regression with a
  parametric-bootstrap interval;
* :mod:`dptrain.settings.inference`: the ``estimator`` settings (``estimator=NAME``);
* :mod:`dptrain.inference.run`: the estimators inside ``task=train`` and the run folder's table.

This package's ``__init__`` imports nothing, so that the config schema can import the settings
without loading torch.
"""
