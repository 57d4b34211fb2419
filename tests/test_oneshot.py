"""The one-shot mechanisms' base and registry (dptrain.release.oneshot): every table, TopDown,
synthesis and employer-employee mechanism is a registered object that declares its settings, its
event and its guarantee; a name without a mechanism cannot be registered; the zCDP conversion is
written once and is dp-accounting's; the typed settings the library reads are built from the
command line's schemas; no task or release module branches on a mechanism's name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import dp_accounting
import numpy as np
import pandas as pd
import pytest

from dptrain.core.neighbours import Neighbours
from dptrain.core.registry import RegistryError
from dptrain.core.validation import ConfigError
from dptrain.privacy.events import Event, epsilon_delta_event, zcdp_event
from dptrain.release.employer import mechanisms as ee
from dptrain.release.oneshot import FAMILIES, ONE_SHOT, OneShotMechanism, available, composed, mechanism_for, names
from dptrain.release.oneshot.er_ee import ErEeSettings
from dptrain.release.oneshot.synthesis import SynthesisSettings, Synthesizer
from dptrain.release.oneshot.tables import TableSettings
from dptrain.release.oneshot.topdown import GeographySettings
from dptrain.release.zcdp import gaussian_rho, zcdp_epsilon
from dptrain.settings.lodes import LodesConfig, er_ee_settings
from dptrain.settings.synthesize import SynthesizeConfig, synthesis_settings
from dptrain.settings.tabulate import TabulateConfig, table_settings
from dptrain.settings.topdown import TopDownConfig, geography_settings

REPO = Path(__file__).resolve().parents[1]

#: each family's settings value, the command line's section it is built from, and the builder
BUILT_FROM = {
    "tables": (TableSettings, TabulateConfig, table_settings),
    "geography": (GeographySettings, TopDownConfig, geography_settings),
    "synthesis": (SynthesisSettings, SynthesizeConfig, synthesis_settings),
    "er_ee": (ErEeSettings, LodesConfig, er_ee_settings),
}


def test_the_built_in_mechanisms_by_family():
    assert {f: names(f) for f in FAMILIES} == {
        "tables": ["gaussian", "laplace"], "sparse_tables": ["stability_histogram"], "geography": ["topdown"],
        "synthesis": ["mst", "mwem"],
        "er_ee": ["log_laplace", "smooth_gamma", "smooth_laplace", "laplace_worker", "employer_laplace"]}


@pytest.mark.parametrize("name", ONE_SHOT.names())
def test_every_mechanism_declares_its_settings_event_and_guarantee(name):
    """Settings: a frozen dataclass (or none) built from its task's checked section by the
    section's own builder, every field a setting of that section. Event and guarantee: the event
    of a run at (epsilon 1, delta 1e-6) gives back (at most) that budget under its relation."""
    mechanism = ONE_SHOT.get(name)
    assert isinstance(mechanism, FAMILIES[mechanism.family]) and isinstance(mechanism.neighbours, Neighbours)
    if mechanism.settings is not None:
        value, section, build = BUILT_FROM[mechanism.family]
        assert mechanism.settings is value and value.__dataclass_params__.frozen
        assert {f.name for f in dataclasses.fields(value)} <= {f.name for f in dataclasses.fields(section)}
        assert isinstance(build(section()), value)
    g = mechanism.guarantee(_event_at(mechanism, 1.0, 1e-6), delta=1e-6, settings=_settings(mechanism))
    assert g.neighbours is mechanism.neighbours and g.accounting
    assert g.epsilon == pytest.approx(1.0, rel=2e-4) and g.epsilon <= 1.0 + 1e-12
    assert g.delta == (1e-6 if mechanism.uses_delta else 0.0)


def _settings(mechanism: OneShotMechanism):
    return None if mechanism.settings is None else BUILT_FROM[mechanism.family][2](BUILT_FROM[mechanism.family][1]())


def _event_at(mechanism: OneShotMechanism, epsilon: float, delta: float) -> Event:
    """The event of a run given (epsilon, delta), in what each family's event takes."""
    if mechanism.family == "tables":
        budget = mechanism.budget(epsilon=epsilon, delta=delta)
        return mechanism.event([mechanism.spent(w, budget) for w in (0.25, 0.75)])
    rho = gaussian_rho(epsilon, delta)
    if mechanism.family == "geography":
        return mechanism.event(type("M", (), {"rho": rho})())
    if mechanism.family == "synthesis":
        return mechanism.event(type("Fitted", (), {"total_rho": rho})())
    return mechanism.event((epsilon, delta))


def test_a_name_without_a_mechanism_cannot_be_registered():
    class NoFit(Synthesizer):  # leaves out its family's method
        pass

    class WrongFamily(Synthesizer):
        family = "tables"

        def fit(self, codes, sizes, settings, *, rho, rng):
            return None

    class NoFamily(OneShotMechanism):
        def event(self, spent):
            return zcdp_event(1.0)

    before = ONE_SHOT.names()
    with pytest.raises(RegistryError, match="register an instance of a subclass"):
        ONE_SHOT.register("bare", object())
    with pytest.raises(TypeError, match="abstract"):
        NoFit()
    with pytest.raises(RegistryError, match="family='tables' is not allowed"):
        ONE_SHOT.register("wrong", WrongFamily())
    with pytest.raises(RegistryError, match="family='' is not allowed"):
        ONE_SHOT.register("none", NoFamily())
    assert ONE_SHOT.names() == before


def test_a_setting_is_checked_against_its_family():
    assert mechanism_for("lodes.publish", "smooth_gamma", "er_ee") is ONE_SHOT.get("smooth_gamma")
    with pytest.raises(ConfigError, match="lodes.publish='mst' is not allowed: must be one of log_laplace, "
                                          "smooth_gamma, smooth_laplace, laplace_worker, employer_laplace"):
        mechanism_for("lodes.publish", "mst", "er_ee")  # registered, in another family


def test_the_smooth_mechanisms_say_when_they_cannot_run():
    """beta above ln(1 + alpha): smooth_gamma's beta is epsilon / 10, smooth_laplace's epsilon /
    (2 ln(2 / delta)); at alpha 0.1 (ln 1.1 = 0.0953) epsilon 4/7 allows neither, 4 both."""
    s = ErEeSettings(alpha=0.1, employer_cap=1000)
    assert available("er_ee", s, epsilon=4 / 7, delta=1e-6 / 7) == ("log_laplace", "laplace_worker",
                                                                    "employer_laplace")
    assert available("er_ee", s, epsilon=4.0, delta=1e-6) == tuple(names("er_ee"))
    assert available("er_ee", s, epsilon=0.96, delta=1e-6) == tuple(n for n in names("er_ee") if n != "smooth_laplace")


def test_composition_is_dp_accountings_zcdp_conversion_plus_basic_composition():
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(0.3))
    eps, delta, rho = composed([zcdp_event(0.1), zcdp_event(0.2)], delta=1e-6)
    assert rho == pytest.approx(0.3) and eps == pytest.approx(acc.get_epsilon(1e-6), rel=1e-12) and delta == 1e-6
    assert composed([epsilon_delta_event(1.0, 1e-7), epsilon_delta_event(0.5)], delta=1e-6) == (1.5, 1e-7, None)
    eps, delta, _ = composed([zcdp_event(0.3), epsilon_delta_event(0.5, 1e-7)], delta=1e-6)
    assert eps == pytest.approx(acc.get_epsilon(1e-6) + 0.5) and delta == pytest.approx(1.1e-6)
    assert zcdp_epsilon(1.0 / (2 * 3.0**2), 1e-6) == pytest.approx(composed([zcdp_event(1 / 18)], delta=1e-6)[0])
    with pytest.raises(ValueError, match="not 'gaussian'"):
        composed([Event("gaussian", (1.0,))], delta=1e-6)


def test_the_zcdp_conversion_is_written_once():
    """Only dptrain/release/zcdp.py turns a zcdp event into an epsilon (it was written in tabulate,
    synthesize, topdown and the Gaussian tables' calibration)."""
    hits = sorted(str(p.relative_to(REPO)) for p in (REPO / "dptrain").rglob("*.py")
                  if "zcdp_event" in (text := p.read_text(encoding="utf-8")) and "history_epsilon(" in text)
    assert hits == ["dptrain/release/zcdp.py"]


def test_no_one_shot_task_branches_on_a_mechanism_name():
    """The one-shot tasks and the mechanisms compare no setting (``*.mechanism``, ``*.method``,
    ``*.publish``, a ``name``) with a registered name: the LODES if/elif (whose bare ``else`` ran
    employer_laplace for any other name) and the synthesis ternary are the registry now."""
    alternatives = "|".join(ONE_SHOT.names())
    pattern = re.compile(rf"""(?<!evaluation)\.(mechanism|method|publish)\s*[!=]=\s*["']({alternatives})["']"""
                         rf"""|\bname\s*[!=]=\s*["']({alternatives})["']""")
    files = [REPO / "dptrain" / "tasks" / f"{t}.py" for t in ("tabulate", "topdown", "synthesize", "lodes")]
    files += sorted((REPO / "dptrain" / "release" / "oneshot").glob("*.py"))
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []
    assert pattern.search('    fitted = mst(...) if s.method == "mst" else mwem(...)')  # the check works
    assert pattern.search('    elif name == "smooth_gamma":')


def test_an_er_ee_mechanism_releases_what_the_task_publishes():
    """Through the registry, the same numbers the numerical mechanisms give (the table of
    task=lodes is this, its key columns first)."""
    cells = pd.DataFrame({"n": [5.0, 50.0, 500.0], "x_max": [3.0, 20.0, 300.0], "n_capped": [5.0, 50.0, 400.0]})
    s = ErEeSettings(alpha=0.1, employer_cap=100)
    released, lo, hi = ONE_SHOT.get("log_laplace").release(cells, s, epsilon=4.0, delta=1e-6,
                                                           rng=np.random.default_rng(3), max_size=30_000)
    assert np.array_equal(released, ee.log_laplace(cells["n"].to_numpy(), 0.1, 4.0, np.random.default_rng(3)))
    assert np.allclose((lo, hi), ee.log_laplace_interval(released, 0.1, 4.0))
