"""``task=audit``: the training settings plus the ``audit`` section."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import (
    bad,
    integer,
    one_of,
    setting,
)
from dptrain.settings.common import TASKS_ALLOWED, check_common
from dptrain.settings.train import TrainRunConfig, check_training


@dataclass
class AuditConfig:
    """The one-run privacy audit (task=audit; :mod:`dptrain.tasks.audit`, Steinke, Nasr, Jagielski 2023).

    ``canaries`` (m) records are each added to the training set independently with probability
    1/2; after training they are scored and the auditor guesses "in" for the k highest, "out"
    for the k lowest (k = floor(f m / 2) for each f in ``guess_fractions``; a union bound over
    the list pays for picking the best). ``mutation: no_noise`` switches the noise off while the
    accountant still claims the configured sigma: a deliberately broken run the audit must catch.
    ``seed: null`` derives the canaries' coin flips from the run seed."""

    canaries: int = setting(1000, help="m canary records, each included with probability 1/2 (each adds a "
                            "feature column)", allowed="an integer in [2, 20000]")
    guess_fractions: list[float] = setting(help="the auditor guesses k = f m / 2 in and k out for each f (a union "
                                           "bound over the list)", allowed="numbers in (0, 1]",
                                           factory=lambda: [0.1, 0.2, 0.5, 1.0])
    confidence: float = setting(0.95, help="confidence of the epsilon lower bound", allowed="a number in (0.5, 1)")
    mutation: str = setting("none", help="no_noise: switch the noise off while the accountant still claims sigma "
                            "(a deliberately broken run the audit must catch)", allowed="none | no_noise")
    score: str = setting("logit_delta", help="canary score: logit_delta (white-box: minus the initial canary "
                         "column) or logit (black-box)", allowed="logit_delta | logit")
    seed: int | None = setting(None, help="seed of the canaries' coin flips; null: derived from the run seed",
                               allowed="an integer >= 0 | null")


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


@dataclass
class AuditRunConfig(TrainRunConfig):
    """task=audit: the training run plus the audit's canaries."""

    task: str = setting("audit", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    audit: AuditConfig = setting(help="the one-run audit", factory=AuditConfig)


def validate_audit(cfg: Any) -> None:
    """Every setting of a ``task=audit`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_training(cfg)
    check_audit(cfg)
