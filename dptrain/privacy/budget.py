"""A run's privacy budget as ONE value: its whole epsilon and delta, and the named shares of it.

The command line turns ``privacy.*`` (and the shares other settings ask for: the coefficient
table's ``estimator.interval_share``) into a :class:`Budget` once, at the task's door; every layer
below reads the budget, never the settings. It is the one place the run's target is split:

* :meth:`Budget.dpsgd` is DP-SGD's part: the target times ``1 - sum of the other shares``;
  :meth:`Budget.gradients` the gradients' part of it when the dp/ curve takes its share of
  DP-SGD's part (:mod:`dptrain.privacy.curves`);
* :meth:`Budget.share` is a named share's fraction of the whole; :meth:`Budget.without` gives a
  share back to DP-SGD (a release the plan decides not to make);
* :meth:`Budget.describe` is the console's line: the whole first, then the shares as shares of it.

The calibrations that meet each part are the one routine of :mod:`dptrain.privacy.calibration`
(through :mod:`dptrain.privacy.accounting`); the budget says what each part is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dptrain.privacy.accounting import DEFAULT, Accountant, accountant_named

__all__ = ["INTERVALS", "Budget"]

#: the share of a run's epsilon that the coefficient table's interval release takes
#: (``estimator.interval_share``; the estimators' ``interval_share``)
INTERVALS = "coefficient intervals"


@dataclass(frozen=True)
class Budget:
    """The privacy budget of one run (module docstring).

    ``enabled``: False for a run without privacy (no epsilon, nothing to split). ``target``: the
    run's whole epsilon (``privacy.target_epsilon``), or None when DP-SGD's noise multiplier is
    given (``noise_multiplier``) and the run's epsilon follows from it. ``delta``: as declared (None:
    the default rule, resolved against the public N). ``accountant``: the headline accountant's
    registered name. ``rtol``: the calibrations' relative tolerance on sigma. ``max_epsilon``: a
    budget that stops DP-SGD early. ``shares``: (name, fraction of the whole) of what is spent
    after DP-SGD, e.g. ``(("intervals", 0.25),)``."""

    enabled: bool = True
    target: float | None = None
    noise_multiplier: float | None = None
    delta: float | None = None
    accountant: str = DEFAULT.name
    rtol: float = 1e-3
    max_epsilon: float | None = None
    shares: tuple[tuple[str, float], ...] = ()

    @property
    def headline(self) -> Accountant:
        """The headline accountant (the object)."""
        return accountant_named(self.accountant)

    def share(self, name: str) -> float:
        """The fraction of the whole that ``name`` takes (0 when it takes none)."""
        return sum(f for n, f in self.shares if n == name)

    @property
    def others(self) -> float:
        """The fraction the shares take together (DP-SGD gets the rest)."""
        return sum(f for _, f in self.shares)

    def epsilon(self, name: str) -> float | None:
        """The epsilon of share ``name`` when the run has a target (None otherwise)."""
        return None if self.target is None else self.target * self.share(name)

    @property
    def dpsgd(self) -> Budget:
        """DP-SGD's part: its target is ``target (1 - others)``; no shares of its own."""
        if not self.shares:
            return self
        target = None if self.target is None else self.target * (1.0 - self.others)
        return replace(self, target=target, shares=())

    def gradients(self, curve: float = 0.0) -> float | None:
        """The epsilon DP-SGD's gradients are calibrated to when the dp/ curve takes ``curve`` of
        DP-SGD's part (:mod:`dptrain.privacy.curves`); None without a target."""
        target = self.dpsgd.target
        return None if target is None else target * (1.0 - curve)

    def without(self, *names: str) -> Budget:
        """The same budget with the named shares given back to DP-SGD."""
        return replace(self, shares=tuple((n, f) for n, f in self.shares if n not in names))

    def with_share(self, name: str, fraction: float) -> Budget:
        """The same budget with ``name`` taking ``fraction`` of the whole (0: none)."""
        rest = tuple((n, f) for n, f in self.shares if n != name)
        return replace(self, shares=rest + (((name, float(fraction)),) if fraction > 0 else ()))

    def whole_from(self, dpsgd_epsilon: float) -> float:
        """The run's whole epsilon when DP-SGD's part is ``dpsgd_epsilon`` (a given sigma): DP-SGD's
        share of the whole is ``1 - others``."""
        return dpsgd_epsilon / (1.0 - self.others) if self.others < 1 else math.inf

    def describe(self, *, curve: float = 0.0) -> str:
        """The whole epsilon, then each share as a share of it (``curve``: the dp/ curve's share of
        DP-SGD's part)."""
        parts = [f"DP-SGD {(1 - self.others) * (1 - curve):g}"]
        if curve:
            parts.append(f"the dp/ curve {(1 - self.others) * curve:g}")
        parts += [f"the {name} {fraction:g}" for name, fraction in self.shares]
        whole = f"target_epsilon={self.target:g}" if self.target is not None else "epsilon"
        return f"the run's {whole} ({self.accountant} accountant; shares of it: {', '.join(parts)})"
