"""dptrain: train models and release statistics under differential privacy."""

import os as _os

# OpenMP threads that spin while they wait turn a 0.2 ms step into tens of ms as soon as another
# process uses a core (measured: experiment=mlp 0.95 s idle -> 4.5 s beside one busy process).
# Waiting threads that sleep cost nothing measurable when the machine is idle. This must be set
# before torch (and its OpenMP runtime) is loaded; an explicit OMP_WAIT_POLICY is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
