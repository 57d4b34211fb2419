"""Where a run computes: ``trainer.device=auto|cpu|cuda|cuda:N`` (docs/devices.md).

One function turns the setting into a :class:`torch.device` before any row is read, and refuses
what cannot work here with an error naming the setting, the value and what is allowed:

* ``auto``: the first CUDA device when torch sees one, else the CPU. In a distributed run
  (``trainer.distributed=true``) each process takes ``cuda:LOCAL_RANK``.
* ``cpu``: the CPU, whatever else is present.
* ``cuda``: the current CUDA device (``cuda:LOCAL_RANK`` in a distributed run); refused when
  this torch build or machine has none.
* ``cuda:N``: that device; refused when it does not exist, and in a distributed run (each
  process picks its own from LOCAL_RANK).

Everything a step touches then lives on that device: the model (built on the CPU from the
public ``seed``, so the initial weights do not depend on the device, then moved), the training
and test rows, the Poisson sampler's random stream and the noise generator
(:meth:`dptrain.privacy.randomness.Randomness.torch` with a device), the engine's buffers.
"""

from __future__ import annotations

import os
import re

import torch

from dptrain.core.validation import ConfigError

_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
ALLOWED = "auto (CUDA when available, else cpu) | cpu | cuda | cuda:N"


class DeviceError(ConfigError):
    """``trainer.device`` names a device this run cannot use."""


def _local_rank() -> int:
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def check_device_setting(value: object, *, setting: str = "trainer.device") -> str:
    """The setting's spelling only (no device is touched): one of ``ALLOWED``."""
    if not isinstance(value, str) or not _PATTERN.match(value.strip()):
        raise DeviceError(f"{setting}={value!r} is not allowed: allowed: {ALLOWED}")
    return value.strip()


def cuda_count() -> int:
    """CUDA devices torch can use here (0 on a CPU-only build)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver behaves as no GPU: ``auto`` falls back, ``cuda`` is refused
        return 0


def resolve_device(value: object, *, distributed: bool = False, setting: str = "trainer.device") -> torch.device:
    """The :class:`torch.device` for the setting (module docstring); raises :class:`DeviceError`
    for a device that does not exist here, before any data is read."""
    value = check_device_setting(value, setting=setting)
    count = cuda_count()
    if value == "cpu" or (value == "auto" and count == 0):
        return torch.device("cpu")
    if count == 0:
        build = torch.__version__
        raise DeviceError(f"{setting}={value!r} is not allowed here: torch sees no CUDA device (torch {build}"
                          f"{', a CPU-only build' if torch.version.cuda is None else ''}); allowed: cpu or auto")
    if value in ("auto", "cuda"):
        index = _local_rank() if distributed else torch.cuda.current_device()
    else:
        if distributed:
            raise DeviceError(f"{setting}={value!r} is not allowed with trainer.distributed=true: each process "
                              "uses cuda:LOCAL_RANK; allowed: cuda or auto")
        index = int(value.split(":")[1])
    if index >= count:
        raise DeviceError(f"{setting}={value!r} is not allowed here: cuda:{index} does not exist (this machine has "
                          f"{count} CUDA device{'s' if count != 1 else ''}: cuda:0..cuda:{count - 1})"
                          + ("; the process's LOCAL_RANK picks it in a distributed run" if distributed else ""))
    return torch.device("cuda", index)


def describe(device: torch.device) -> str:
    """For the report: ``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    if device.type == "cuda":
        try:
            return f"{device} ({torch.cuda.get_device_name(device)})"
        except Exception:
            return str(device)
    return str(device)
