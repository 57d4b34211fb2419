"""The one base class of every error dptrain raises for bad input.

Every error a user can cause (a setting, a data file, a checkpoint, a model, a release) is a
:class:`DPTrainError`: its message names the setting, the value and what is allowed, and never
quotes a private value or a count of private rows. The command line catches this one class,
prints the message and exits with status 2 before anything is written.
"""

from __future__ import annotations


class DPTrainError(ValueError):
    """Bad input to dptrain; the message says which setting, which value, and what is allowed."""


class ReleaseError(DPTrainError):
    """Bad release input; the message names the setting/column, the value and what is allowed,
    never a private value and never a private count (rows, rows per cell, cells with rows)."""
