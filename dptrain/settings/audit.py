"""``task=audit``: the training settings plus the ``audit`` section."""

from __future__ import annotations

import math
from typing import Any

from dptrain.core.validation import (
    bad,
    integer,
    one_of,
)
from dptrain.settings.common import check_common
from dptrain.settings.schemas.train import (  # the schemas: no torch, no pandas
    AuditRunConfig,
)
from dptrain.settings.train import check_training

MAX_CANARIES = 20000  # audit.canaries: each adds a feature column (N x m floats in memory)


def check_audit(cfg: AuditRunConfig) -> None:
    """An audit run: its own settings, and a private run to audit (one fresh run, binary)."""
    a = cfg.audit
    integer("audit.canaries", a.canaries, 2, f"must be an integer in [2, {MAX_CANARIES}] (each canary adds a "
            "feature column)")
    if a.canaries > MAX_CANARIES:
        raise bad("audit.canaries", a.canaries,
                  f"must be an integer in [2, {MAX_CANARIES}] (each canary adds a feature column)")
    if len(a.guess_fractions) == 0:
        raise bad("audit.guess_fractions", list(a.guess_fractions), "give at least one fraction in (0, 1]")
    for f in a.guess_fractions:
        if not (isinstance(f, (int, float)) and 0 < f <= 1):
            raise bad("audit.guess_fractions", list(a.guess_fractions), "every fraction must be in (0, 1]")
        if math.floor(f * a.canaries / 2) < 1:
            raise bad("audit.guess_fractions", list(a.guess_fractions),
                      f"fraction {f} of audit.canaries={a.canaries} gives no guess (need f * m / 2 >= 1)")
    if not (0.5 < a.confidence < 1):
        raise bad("audit.confidence", a.confidence, "must be in (0.5, 1), e.g. 0.95")
    one_of("audit.mutation", a.mutation, ("none", "no_noise"))
    one_of("audit.score", a.score, ("logit_delta", "logit"))
    if not cfg.privacy.enabled:
        raise bad("privacy.enabled", False, "task=audit audits a DP-SGD run: needs privacy.enabled=true "
                  "(audit.mutation=no_noise audits a deliberately broken one)")
    if cfg.trainer.resume is not None:
        raise bad("trainer.resume", cfg.trainer.resume, "must be null for task=audit (an audit is one fresh run)")
    if cfg.objective.name != "binary":
        raise bad("objective", cfg.objective.name, "task=audit scores label-1 canaries: needs objective=binary")


def validate_audit(cfg: Any) -> None:
    """Every setting of a ``task=audit`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_training(cfg)
    check_audit(cfg)
