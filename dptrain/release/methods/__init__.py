"""The release methods, one module each, registered in :data:`RELEASE_METHODS` under their
``release.method`` names (docs/release.md section 5):

=================  ======================  ================================================
module             release.method          guarantee
=================  ======================  ================================================
``mos``            mos                     none (epsilon-DP only conditional on chi)
``dp_mos``         dp_mos                  (epsilon, delta)-DP end to end, add/remove
``suppression``    suppression_5/_10/_20   none (EXACT values)
``ss_laplace``     ss_laplace              epsilon-DP, add/remove
``noisy_stats``    noisy_stats             epsilon-DP, replace-one
``theil_sen``      theil_sen(_wide)        epsilon-DP, replace-one
``dp_gd``          dp_gd                   (epsilon, delta)-DP, add/remove
``dp_sgd``         dp_sgd                  (epsilon, delta)-DP, add/remove
=================  ======================  ================================================

``base`` holds the registry and the :class:`ReleaseMethod` base class, ``common`` the helpers
the methods share. Importing this package registers every method above, in this order (the
order of the private evaluation's comparison). A new built-in method is one module here and one
line below; a method of your own package is loaded by the ``plugins`` setting (docs/extending.md).
A method may declare settings of its own (``ReleaseMethod.settings``), given as
``release.method_settings={name: value}`` and checked by the method before any row is read.
"""

from typing import Any

from dptrain.core.validation import bad
from dptrain.release.methods.base import (
    RELEASE_METHODS,
    MethodResult,
    ReleaseMethod,
    check_method_settings,
    evaluation_methods,
    run_method,
)

# the order of registration is the order of the evaluation's comparison
# isort: off
from dptrain.release.methods import mos, dp_mos, suppression, ss_laplace, noisy_stats  # noqa: F401
from dptrain.release.methods import theil_sen, dp_gd, dp_sgd  # noqa: F401
# isort: on

#: the built-in method modules, imported (and so registered) in this order above
BUILTIN = ("mos", "dp_mos", "suppression", "ss_laplace", "noisy_stats", "theil_sen", "dp_gd", "dp_sgd")

__all__ = ["BUILTIN", "RELEASE_METHODS", "MethodResult", "ReleaseMethod", "check_method_settings",
           "evaluation_methods", "run_method"]


def check_release_method(r: Any) -> None:
    """``release.method``, ``release.method_settings`` (the keys the method declares, its own
    value checks) and ``release.suppression_k`` against the registry (the built-in methods and
    the plugins' are registered once this package is imported); called by the release run before
    any row is read."""
    check_method_settings(r)
    unregistered = [k for k in r.suppression_k if f"suppression_{k}" not in RELEASE_METHODS]
    if unregistered:
        known = [n.removeprefix("suppression_") for n in RELEASE_METHODS if n.startswith("suppression_")]
        raise bad("release.suppression_k", list(r.suppression_k),
                  f"thresholds of registered methods suppression_K: {', '.join(known)} (a plugin can register "
                  "another: RELEASE_METHODS.register('suppression_K', Suppression(K)))")
