"""``task=tune``: the training settings plus the ``tune`` section (the searched space, the law
of the number of candidates)."""

from __future__ import annotations

from typing import Any

from dptrain.core.validation import (
    bad,
    integer,
    one_of,
    real,
)
from dptrain.settings.common import check_common
from dptrain.settings.schemas.train import (  # the schemas: no torch, no pandas
    TuneRunConfig,  # noqa: F401
)
from dptrain.settings.train import check_training

#: the laws of the number of candidates (``tune.candidates``)
LAWS = ("truncated_negative_binomial", "poisson")


#: settings a candidate may NOT vary: they change the mechanism (q, steps, sigma, delta), the data
#: or the task, so the candidates would not share one base event
FIXED_PREFIXES = ("privacy.", "trainer.epochs", "trainer.batch_size", "trainer.resume", "trainer.engine", "data.",
                  "task", "seed", "tune.", "estimator.", "logger.", "objective.", "plugins", "overwrite")


SEARCHABLE_HINT = ("optim.* (lr, momentum, weight_decay...), privacy.max_grad_norm (C does not change the "
                   "privacy of a step), model.* (hidden, activation...), trainer.threads")


def flatten_space(space: Any, prefix: str = "") -> dict[str, list[Any]]:
    """``tune.space`` (nested mappings whose leaves are lists) as {dotted setting: values}."""
    out: dict[str, list[Any]] = {}
    for key, value in (space or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_space(value, prefix=name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = list(value)
        else:
            raise bad(f"tune.space.{name}", value, "must be a list of values to choose from, e.g. [0.1, 0.5, 1.0]")
    return out


def check_tune(cfg: Any) -> None:
    """task=tune's own settings, before any row is read (the candidates' values are checked by
    :func:`candidate_configs`)."""
    t = cfg.tune
    one_of("tune.candidates", t.candidates, LAWS)
    real("tune.mean", t.mean, "must be a number >= 1 (the expected number of candidates)", lo=1.0)
    if t.candidates == "truncated_negative_binomial":
        real("tune.shape", t.shape, "must be a number >= 0 (0: logarithmic, 1: geometric)", lo=0.0)
    real("tune.validation_fraction", t.validation_fraction, "must be in (0, 0.5]", lo=0.0, hi=0.5, lo_open=True)
    real("tune.score_noise", t.score_noise, "must be a number > 0 (noise sd on the score's sum)", lo=0.0,
         lo_open=True)
    integer("tune.max_expected_candidates", t.max_expected_candidates, 1)
    if t.mean > t.max_expected_candidates:
        raise bad("tune.mean", t.mean, f"must be <= tune.max_expected_candidates={t.max_expected_candidates} (a "
                  "guard against a typo that would train thousands of models; raise it to search more)")
    p = cfg.privacy
    if not p.enabled:
        raise bad("privacy.enabled", False, "task=tune is a private search: needs privacy.enabled=true (a "
                  "non-private search is a plain sweep: python -m dptrain -m optim.lr=...)")
    if p.target_epsilon is None:
        raise bad("privacy.target_epsilon", None, "task=tune needs the TOTAL epsilon of the search, selection and "
                  "released model as privacy.target_epsilon=E (sigma is calibrated for the whole search; a fixed "
                  "privacy.noise_multiplier is not allowed)")
    if p.max_epsilon is not None:
        raise bad("privacy.max_epsilon", p.max_epsilon, "must be null for task=tune (every candidate runs the same "
                  "planned steps: the search's accounting needs one base mechanism)")
    if cfg.trainer.resume is not None:
        raise bad("trainer.resume", cfg.trainer.resume, "must be null for task=tune (a search is one fresh run)")
    if cfg.trainer.distributed:
        raise bad("trainer.distributed", True, "must be false for task=tune (the search trains its candidates in "
                  "one process, on every row: a sharded read cannot hold them); allowed: trainer.distributed=false")
    if cfg.estimator.name != "dpsgd":
        raise bad("estimator", cfg.estimator.name, "task=tune tunes DP-SGD training: needs estimator=dpsgd")
    space = flatten_space(t.space)
    if not space:
        raise bad("tune.space", t.space, "is empty: nothing to search; allowed: lists of values per setting, e.g. "
                  "tune=lr_clip or '++tune.space={optim: {lr: [0.5, 1, 2]}, privacy: {max_grad_norm: [0.5, 1]}}'")
    for key, values in space.items():
        if key == "privacy.max_grad_norm":
            pass
        elif any(key == f or key.startswith(f) for f in FIXED_PREFIXES):
            raise bad(f"tune.space.{key}", values, "is not searchable: it changes the privacy mechanism, the data "
                      f"or the task, so the candidates would not share one base event; searchable: {SEARCHABLE_HINT}")
        if len(values) == 0:
            raise bad(f"tune.space.{key}", values, "must list at least one value")


def validate_tune(cfg: Any) -> None:
    """Every setting of a ``task=tune`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_training(cfg)
    check_tune(cfg)
