"""One-shot releases: what a mechanism is, and the one registry of them.

A one-shot release publishes, once, what a task computes from the rows: noisy tables
(task=tabulate), a geography's counts made consistent (task=topdown), a synthetic file
(task=synthesize), employer-employee counts (task=lodes). Every mechanism of those tasks is an
instance of a :class:`OneShotMechanism` subclass, registered in :data:`ONE_SHOT` under the name
its task's setting picks. Each declares

* ``family``: the task that runs it, and so what it is handed and gives back: its family's base
  class (:data:`FAMILIES`) fixes the methods a member implements. The families: ``tables``
  (task=tabulate, ``privacy.mechanism``), ``sparse_tables`` (task=tabulate, ``tabulate.sparse``),
  ``geography`` (task=topdown), ``synthesis`` (task=synthesize, ``synthesize.method``),
  ``er_ee`` (task=lodes, ``lodes.publish``);
* ``settings``: the frozen dataclass of the settings it reads (its family's; the command line
  builds it once from its checked section, a Python caller directly);
* ``neighbours``: the relation of its guarantee, and ``uses_delta``: whether it has a delta;
* :meth:`OneShotMechanism.event`: what one run spends, as a privacy event (``zcdp`` rho, or
  ``epsilon_delta``: :mod:`dptrain.privacy.events`);
* :meth:`OneShotMechanism.guarantee`: its :class:`Guarantee`, the (epsilon, delta) of its event
  under its relation (:func:`composed`: a zCDP rho converted by
  :func:`dptrain.release.zcdp.zcdp_epsilon`, the one conversion) and the words its report prints.

A name exists only with its mechanism: :data:`ONE_SHOT` refuses to register anything but an
instance of a :class:`OneShotMechanism` subclass of a known family that implements every method
(an abstract one left out makes the instance impossible), and each task checks its setting
against the names of its family (:func:`mechanism_for`) before any row is read. There is no list
of names beside the registry and no branch on a name. A new mechanism is one module that
registers an instance, ``ONE_SHOT.register("name", MyMechanism())``, loaded with
``plugins=[my_module]`` (docs/extending.md); a built-in one is a module of this package and one
import line in its ``__init__``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, is_dataclass
from typing import Any, ClassVar

from dptrain.core.neighbours import Neighbours
from dptrain.core.registry import Registry, RegistryError
from dptrain.core.validation import one_of
from dptrain.privacy.accounting import RDP
from dptrain.privacy.events import Event
from dptrain.release.zcdp import zcdp_epsilon

#: what a mechanism's ``settings`` parameter holds: an instance of its family's frozen settings
#: dataclass (the class in its ``settings`` attribute: TableSettings, SynthesisSettings, ...), a
#: typed value the command line's schemas build (never the command line's configuration)
MechanismSettings = Any


@dataclass(frozen=True)
class Guarantee:
    """What one release satisfies: (``epsilon``, ``delta``) under ``neighbours``, obtained by
    ``accounting`` (in words), with the zCDP ``rho`` where the mechanism is zCDP; ``statement``,
    ``protects`` and ``bias``: the words a report prints beside the numbers ("" where the task
    words it)."""

    epsilon: float
    delta: float
    neighbours: Neighbours
    accounting: str
    rho: float | None = None
    statement: str = ""
    protects: str = ""
    bias: str = ""


def composed(events: Iterable[Event], *, delta: float) -> tuple[float, float, float | None]:
    """(epsilon, delta, rho) of ``events`` composed: the ``zcdp`` events' rhos summed and converted
    once at ``delta`` (:func:`~dptrain.release.zcdp.zcdp_epsilon`), the ``epsilon_delta`` events
    by basic composition (epsilons and deltas summed), and the two parts by basic composition.
    ``rho`` is the zCDP total, None without a zCDP event. Raises ValueError for another kind."""
    rho, epsilon, spent_delta, zcdp = 0.0, 0.0, 0.0, False
    for event in events:
        if event.kind == "zcdp":
            rho, zcdp = rho + event.params[0], True
        elif event.kind == "epsilon_delta":
            epsilon, spent_delta = epsilon + event.params[0], spent_delta + event.params[1]
        else:
            raise ValueError(f"a one-shot release composes zcdp and epsilon_delta events, not {event.kind!r}")
    if zcdp:
        return zcdp_epsilon(rho, delta) + epsilon, delta + spent_delta, rho
    return epsilon, spent_delta, None


class OneShotMechanism(ABC):
    """A one-shot mechanism (module docstring). Subclass its family's base class, implement the
    family's methods and :meth:`event`, and register an instance in :data:`ONE_SHOT`."""

    #: the task that runs it (a key of FAMILIES); set by its family's base class
    family: ClassVar[str] = ""
    #: the frozen dataclass of the settings it reads (its family's); None: it reads none
    settings: ClassVar[type | None] = None
    #: the neighbour relation of its guarantee
    neighbours: ClassVar[Neighbours] = Neighbours.ADD_REMOVE
    #: whether its guarantee has a delta (the run's privacy.delta is checked and reported only then)
    uses_delta: ClassVar[bool] = True

    def unavailable(self, settings: MechanismSettings, *, epsilon: float, delta: float) -> str | None:
        """Why it cannot run with ``settings`` at (``epsilon``, ``delta``), from public values
        only, before any row is read ("needs ..."); None when it can (the default)."""
        return None

    @abstractmethod
    def event(self, spent: Any) -> Event:
        """The privacy event of one run, from what it spent (``spent``: what the family's method
        returned or planned, its family's base class says which)."""

    def guarantee(self, event: Event, *, delta: float, settings: MechanismSettings = None) -> Guarantee:
        """Its guarantee for ``event`` (:func:`composed` at the run's ``delta``); a mechanism
        overrides it to add its words (``settings``: the run's, for words that name them)."""
        epsilon, spent_delta, rho = composed([event], delta=delta)
        how = "basic composition" if rho is None else f"{RDP.name} (zCDP)"
        return Guarantee(epsilon, spent_delta, Neighbours(self.neighbours), how, rho)


#: each family's base class by its name (:func:`family_base`): what a member is handed and gives back
FAMILIES: dict[str, type[OneShotMechanism]] = {}


def family_base(cls: type[OneShotMechanism]) -> type[OneShotMechanism]:
    """Class decorator: ``cls`` is the base class of the family ``cls.family`` (every registered
    mechanism of that family is an instance of it)."""
    FAMILIES[cls.family] = cls
    return cls


class MechanismRegistry(Registry[OneShotMechanism]):
    """The one-shot mechanisms by name: only an instance of a :class:`OneShotMechanism` subclass
    of a known family, with a dataclass (or no) ``settings``, can be registered."""

    def register(self, name: str, obj: OneShotMechanism | None = None, *,
                 replace: bool = False) -> Callable[[OneShotMechanism], OneShotMechanism] | OneShotMechanism:
        def add(item: OneShotMechanism) -> OneShotMechanism:
            _check_mechanism(name, item)
            return Registry.register(self, name, item, replace=replace)

        return add(obj) if obj is not None else add


def _check_mechanism(name: str, item: Any) -> None:
    if not isinstance(item, OneShotMechanism):
        raise RegistryError(f"one-shot mechanism {name!r}={item!r} is not allowed: register an instance of a "
                            "subclass of its family's base class (dptrain.release.oneshot)")
    base = FAMILIES.get(item.family)
    if base is None or not isinstance(item, base):
        raise RegistryError(f"one-shot mechanism {name!r}: family={item.family!r} is not allowed: a subclass of "
                            "one family's base class: " + ", ".join(f"{k} ({v.__name__})" for k, v in FAMILIES.items()))
    if item.settings is not None and not (isinstance(item.settings, type) and is_dataclass(item.settings)):
        raise RegistryError(f"one-shot mechanism {name!r}: settings={item.settings!r} is not allowed: a dataclass "
                            "type, or None")
    Neighbours.parse(item.neighbours, setting=f"one-shot mechanism {name!r}: neighbours")


ONE_SHOT: MechanismRegistry = MechanismRegistry("one-shot mechanism", setting="mechanism")


def names(family: str) -> list[str]:
    """The registered mechanisms of ``family``, in registration order."""
    return [name for name in ONE_SHOT if ONE_SHOT.get(name).family == family]


def mechanism_for(setting: str, name: Any, family: str) -> OneShotMechanism:
    """The mechanism ``name`` of ``family``; a ConfigError naming ``setting``, the value and the
    family's registered names otherwise (before any row is read)."""
    one_of(setting, name, names(family))
    return ONE_SHOT.get(name)


def available(family: str, settings: MechanismSettings, *, epsilon: float, delta: float) -> tuple[str, ...]:
    """The mechanisms of ``family`` that can run with ``settings`` at (``epsilon``, ``delta``)."""
    return tuple(name for name in names(family)
                 if ONE_SHOT.get(name).unavailable(settings, epsilon=epsilon, delta=delta) is None)
