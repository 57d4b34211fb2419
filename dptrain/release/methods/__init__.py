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
order of the private evaluation's comparison), then any other module of this folder (a new
method is one file here), in name order. Methods of your own package are loaded by the
``plugins`` setting instead.
"""

import importlib
import pkgutil
from typing import Any

from dptrain.release.methods.base import (
    RELEASE_METHODS,
    MethodResult,
    ReleaseMethod,
    evaluation_methods,
    run_method,
)
from dptrain.validation import bad

#: the built-in method modules, imported (and so registered) in this order
BUILTIN = ("mos", "dp_mos", "suppression", "ss_laplace", "noisy_stats", "theil_sen", "dp_gd", "dp_sgd")
_NOT_METHODS = ("base", "common")
_others = sorted(m.name for m in pkgutil.iter_modules(__path__)
                 if m.name not in BUILTIN + _NOT_METHODS and not m.name.startswith("_"))
for _module in (*BUILTIN, *_others):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["BUILTIN", "RELEASE_METHODS", "MethodResult", "ReleaseMethod", "evaluation_methods", "run_method"]


def check_release_method(r: Any) -> None:
    """``release.method`` and ``release.suppression_k`` against the registry (the built-in methods
    and the plugins' are registered once this package is imported); called by the release run
    before any row is read."""
    RELEASE_METHODS.get(r.method)
    unregistered = [k for k in r.suppression_k if f"suppression_{k}" not in RELEASE_METHODS]
    if unregistered:
        known = [n.removeprefix("suppression_") for n in RELEASE_METHODS if n.startswith("suppression_")]
        raise bad("release.suppression_k", list(r.suppression_k),
                  f"thresholds of registered methods suppression_K: {', '.join(known)} (a plugin can register "
                  "another: RELEASE_METHODS.register('suppression_K', Suppression(K)))")
