"""dptrain: train models and release statistics under differential privacy."""

import os as _os

# OpenMP threads that spin while they wait turn a 0.2 ms step into tens of ms as soon as another
# process uses a core (measured: experiment=mlp 0.95 s idle -> 4.5 s beside one busy process).
# Waiting threads that sleep cost nothing measurable when the machine is idle. This must be set
# before torch (and its OpenMP runtime) is loaded; an explicit OMP_WAIT_POLICY is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The same for OpenBLAS (numpy's and scipy's BLAS: the sklearn baseline's fit): its idle threads
# spin for 2^28 cycles (~0.1 s) after every call before they sleep. On 2 busy cores that made the
# baseline fit of experiment=logit 2-4x slower (measured: 4.3 s -> 1.4 s). 4 (2^4 cycles, the
# smallest value OpenBLAS takes) lets them sleep at once; it changes when threads sleep, not how
# the work is split, so every result is bit for bit the same. Read when numpy loads OpenBLAS,
# so it too must be set first; an explicit OPENBLAS_THREAD_TIMEOUT is kept.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"
