"""The one-shot release mechanisms, one registry (:data:`ONE_SHOT`) and one base class
(:class:`OneShotMechanism`, :mod:`dptrain.release.oneshot.base`), by family:

============================  ==================  ================================================
module (family base)          registered names    guarantee
============================  ==================  ================================================
``tables`` (TableMechanism)   gaussian, laplace   rho-zCDP -> (epsilon, delta); (epsilon, 0)-DP
``tables`` (SparseTable...)   stability_histogram (epsilon, delta)-DP
``topdown`` (Geography...)    topdown             rho-zCDP -> (epsilon, delta); invariants exact
``synthesis`` (Synthesizer)   mst, mwem           rho-zCDP -> (epsilon, delta)
``er_ee`` (ErEeMechanism)     log_laplace,        (alpha, epsilon[, delta])-ER-EE; worker- and
                              smooth_gamma,       employer-level (epsilon, 0)-DP
                              smooth_laplace,
                              laplace_worker,
                              employer_laplace
============================  ==================  ================================================

Importing this package registers every mechanism above, in this order (a family's order is the
order its task runs and reports them). A new built-in mechanism is one module here (or a class in
its family's module) and one line below; a mechanism of your own package is loaded with the
``plugins`` setting (docs/extending.md, "A new one-shot mechanism").
"""

# the order of registration is the order each task runs and reports its family's mechanisms
# isort: off
from dptrain.release.oneshot import tables, topdown, synthesis, er_ee  # noqa: F401
# isort: on
from dptrain.release.oneshot.base import (
    FAMILIES,
    ONE_SHOT,
    Guarantee,
    OneShotMechanism,
    available,
    composed,
    family_base,
    mechanism_for,
    names,
)

__all__ = ["FAMILIES", "ONE_SHOT", "Guarantee", "OneShotMechanism", "available", "composed", "family_base",
           "mechanism_for", "names"]
