"""The accounting cache (dptrain.privacy.cache): an event's RDP curve and a history's PLD epsilon,
kept on disk by their public inputs, give the same numbers as computing them, and a run with a
warm cache does not import dp-accounting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dptrain.privacy import accounting, cache

REPO = Path(__file__).resolve().parents[1]
SETTING = {"sample_rate": 0.0315, "noise_multiplier": 2.6, "steps": 318, "delta": 1e-5}


@pytest.fixture
def cache_in(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(cache.SWITCH, raising=False)
    accounting._rdp_per_step.cache_clear()
    accounting._pld_composed.cache_clear()
    yield tmp_path / "accounting"
    accounting._rdp_per_step.cache_clear()


def _epsilons() -> tuple[float, float]:
    return accounting.rdp_epsilon(**SETTING), accounting.pld_epsilon(**SETTING)


def test_cached_values_are_the_computed_ones(cache_in):
    cold = _epsilons()
    files = sorted(p.name for p in cache_in.iterdir())
    assert len(files) == 2 and files[0].startswith("pld-") and files[1].startswith("rdp-")
    assert oct(cache_in.stat().st_mode & 0o777) == "0o700"
    accounting._rdp_per_step.cache_clear()
    accounting._pld_composed.cache_clear()
    assert _epsilons() == cold  # read back: the same floats, bit for bit
    assert cold[0] == pytest.approx(0.9453, abs=1e-3) and cold[1] < cold[0]


def test_a_damaged_entry_is_recomputed_and_the_switch_turns_it_off(cache_in, monkeypatch):
    cold = _epsilons()
    for p in cache_in.iterdir():
        p.write_text(json.dumps({"values": [1.0]}) if p.name.startswith("rdp-") else "not json")
    accounting._rdp_per_step.cache_clear()
    assert _epsilons() == cold  # wrong length and unreadable: ignored, recomputed, stored again
    assert all(len(json.loads(p.read_text())["values"]) > 0 for p in cache_in.iterdir())
    monkeypatch.setenv(cache.SWITCH, "0")
    assert cache.cache_dir() is None
    accounting._rdp_per_step.cache_clear()
    other = accounting.rdp_epsilon(**{**SETTING, "noise_multiplier": 3.1})
    assert other < cold[0] and len(list(cache_in.iterdir())) == 2  # nothing stored while off


def test_a_warm_cache_computes_without_importing_dp_accounting(cache_in):
    """A fresh interpreter with the cache filled by this process: the same epsilons, and
    dp-accounting (with the parts of scipy it loads) never imported."""
    cold = _epsilons()
    code = ("import json, sys\nfrom dptrain.privacy import accounting\n"
            f"s = {SETTING!r}\n"
            "print(json.dumps([accounting.rdp_epsilon(**s), accounting.pld_epsilon(**s), "
            "'dp_accounting' in sys.modules]))")
    env = {"DPTRAIN_CACHE_DIR": str(cache_in.parent), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rdp, pld, imported = json.loads(res.stdout)
    assert (rdp, pld) == cold and imported is False
