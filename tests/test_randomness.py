"""Secret randomness: the DP noise and the Poisson sampler cannot be regenerated from anything a
run writes, distinct runs never share a stream, and reproducible noise is an explicit opt-in.

The two attacks of the review are reproduced here. On the old behaviour every stream was
derived from the published `seed`: an adversary holding the run folder and the command line
retrained on D and on D minus the target with the same streams and matched the released model
bit for bit (membership decided every time), and two runs of a sweep at sigma 2 and 4 shared
their batch and noise vector, which gave the exact clipped gradient sum. The "old" behaviour is
emulated by handing the adversary the run's streams (a seed file whose secret he knows); the
default behaviour is what a run does today.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import dptrain.privacy.randomness as rnd
from dptrain.data import load_dataset
from dptrain.privacy.randomness import (
    Randomness,
    RandomnessError,
    new_seed_file,
    seeded_mt19937,
    settings_digest,
)
from dptrain.runfolder.tracking import Tracker
from dptrain.settings.train import validate_against_size
from dptrain.tasks import cli
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate
from dptrain.training.fit import LaunchConfig, fit, mechanism_for

# ------------------------------------------------------------------------------ generators


def test_mt19937_state_layout_matches_a_reference_generator():
    """seeded_mt19937 writes the 624 state words where torch keeps them: the words numpy's
    MT19937 (RandomState) derives from a seed give exactly torch's manual_seed stream."""
    for seed in (0, 12345, 2**32 - 1):
        words = np.random.RandomState(seed).get_state()[1]
        ours, ref = seeded_mt19937(words), torch.Generator().manual_seed(seed)
        assert torch.equal(torch.randn(1000, generator=ours), torch.randn(1000, generator=ref))
        assert ours.initial_seed() == 0  # the seed field reveals nothing


def test_manual_seed_keeps_32_bits_but_our_streams_keep_all_of_them():
    """Found in review: torch.Generator.manual_seed keeps 32 effective bits, so seeds that
    differ only above bit 32 gave the same noise. Streams from secrets that differ only in high
    bits are different here."""
    a = torch.randn(64, generator=torch.Generator().manual_seed(7))
    b = torch.randn(64, generator=torch.Generator().manual_seed(7 + 2**32))
    assert torch.equal(a, b)  # the trap
    low, high = Randomness(mode="os", _entropy=7), Randomness(mode="os", _entropy=7 + 2**200)
    assert not torch.equal(torch.randn(64, generator=low.torch("n")), torch.randn(64, generator=high.torch("n")))
    assert not np.array_equal(low.numpy("s").random(8), high.numpy("s").random(8))


def test_fresh_streams_differ_and_are_standard():
    r1, r2 = Randomness.fresh(), Randomness.fresh()
    z1, z2 = (torch.randn(200_000, generator=r.torch("gaussian-noise")) for r in (r1, r2))
    assert not torch.equal(z1, z2)
    assert abs(float(z1.mean())) < 5 / 200_000**0.5 and abs(float(z1.std()) - 1) < 0.01
    # named streams of one run are independent of each other
    assert not torch.equal(torch.randn(8, generator=r1.torch("a")), torch.randn(8, generator=r1.torch("b")))
    assert not np.array_equal(r1.numpy("p", 0).random(8), r1.numpy("p", 1).random(8))
    assert "_entropy" not in repr(r1) and str(r1._entropy) not in repr(r1) + r1.describe()


def test_seed_file_rules(tmp_path):
    key = new_seed_file(tmp_path / "k")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(FileExistsError):
        new_seed_file(key)  # never overwrites a secret
    a = Randomness.from_seed_file(key, run_label="x")
    b = Randomness.from_seed_file(key, run_label="x")
    c = Randomness.from_seed_file(key, run_label="y")
    # a key draws once bound to its data (tests/test_noise_key.py)
    draw = lambda r: torch.randn(16, generator=r.for_data("rows").torch("gaussian-noise"))  # noqa: E731
    assert torch.equal(draw(a), draw(b)) and not torch.equal(draw(a), draw(c))
    assert "REMOVE the noise" in a.describe() and key.read_text().strip() not in a.describe()
    short = tmp_path / "short"
    short.write_text("ab" * 15)  # 120 bits
    for bad, needle in ((short, "at least 128 bits"), (tmp_path / "missing", "cannot be read")):
        with pytest.raises(RandomnessError, match=needle):
            Randomness.from_seed_file(bad, run_label="x")
    inside = tmp_path / "run" / "k"
    inside.parent.mkdir()
    inside.write_text(key.read_text())
    with pytest.raises(RandomnessError, match="inside the run folder"):
        Randomness.from_seed_file(inside, run_label="x", run_dir=tmp_path / "run")


def test_settings_digest_separates_runs_that_compute_differently():
    base = {"seed": 0, "privacy": {"noise_multiplier": 2.0, "max_epsilon": None}, "trainer": {"threads": 1}}
    other_sigma = {**base, "privacy": {"noise_multiplier": 4.0, "max_epsilon": None}}
    assert settings_digest(base) != settings_digest(other_sigma)
    assert settings_digest(base) != settings_digest({**base, "seed": 1})
    # where to write, how often to log, threads, a budget (a prefix of the same run): same label
    same = {**base, "trainer": {"threads": 2, "resume": "auto"}, "hydra": {"run": "x"},
            "privacy": {"noise_multiplier": 2.0, "max_epsilon": 0.5}}
    assert settings_digest(base) == settings_digest(same)


# ------------------------------------------------------------------------------ attacks


def _setup(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
            "experiment=logit", "data=synthetic", "data.n_rows=400", "trainer.progress=false",
            "trainer.baseline=false", "trainer.batch_size=64", "logger.tensorboard=false", *overrides]))
    validate(cfg)
    data = load_dataset(cfg.data, seed=cfg.seed)
    return cfg, data, validate_against_size(cfg, data.n_train)


def _without_row(data, i: int):
    from dptrain.data import Dataset

    keep = torch.ones(data.n_train, dtype=torch.bool)
    keep[i] = False
    return Dataset(x_train=data.x_train[keep].contiguous(), y_train=data.y_train[keep].contiguous(),
                   x_test=data.x_test, y_test=data.y_test, feature_names=data.feature_names, source=data.source)


def _train(cfg, data, delta, tmp_path, randomness, dataset_size):
    plan = training_plan(cfg)
    res = fit(plan, data, mechanism=mechanism_for(plan, dataset_size=dataset_size, delta=delta),
              tracker=Tracker(tmp_path, tensorboard=False), launch=LaunchConfig(randomness=randomness))
    return torch.cat([p.detach().flatten() for p in res.model.parameters()])


def _membership_game(tmp_path, *, trials: int, adversary_knows_streams: bool) -> tuple[int, int]:
    """(exact matches, correct guesses) of the replay adversary over ``trials`` games. In each,
    the released model is trained on D (target in) or D minus row 0 (out); the adversary holds
    the released parameters, the config and the seed, retrains both worlds and guesses the one
    whose replica is nearest (an exact match decides it). N is public and the same in both
    worlds (as the accountant treats it), so only the target row differs."""
    cfg, data, delta = _setup(["trainer.epochs=2", "privacy.noise_multiplier=1.0"])
    worlds = {True: data, False: _without_row(data, 0)}
    n = data.n_train
    coins = np.random.default_rng(2026).random(trials) < 0.5
    matches = correct = 0
    for member in coins:
        run_streams = Randomness(mode="os", _entropy=secrets.randbits(256))
        released = _train(cfg, worlds[member], delta, tmp_path, run_streams, n)
        # the adversary's best reconstruction of the streams: the run's own (old behaviour,
        # where they followed from the published seed) or a guess (today: nothing published)
        guess_streams = run_streams if adversary_knows_streams else Randomness(mode="os", _entropy=cfg.seed)
        replicas = {w: _train(cfg, worlds[w], delta, tmp_path, guess_streams, n) for w in (True, False)}
        dist = {w: float((replicas[w] - released).norm()) for w in (True, False)}
        matches += sum(d == 0.0 for d in dist.values())
        correct += int(min(dist, key=dist.get) == member)
    return matches, correct


def test_replay_membership_attack_wins_with_the_streams_and_is_at_chance_without(tmp_path):
    trials = 24
    matches, correct = _membership_game(tmp_path, trials=trials, adversary_knows_streams=True)
    assert matches == trials and correct == trials  # the old behaviour: decided every time, bit for bit
    matches, correct = _membership_game(tmp_path, trials=trials, adversary_knows_streams=False)
    assert matches == 0
    # at chance: a two-sided 99.9% binomial interval around 1/2 for 24 games is [5, 19]
    assert 5 <= correct <= 19, correct


def _one_step_update(cfg_over: list[str], tmp_path, randomness) -> tuple[torch.Tensor, float, int]:
    """(parameter change of ONE DP-SGD step, expected batch size B, N) with lr 1 and plain SGD."""
    cfg, data, delta = _setup(["optim.lr=1.0", *cfg_over])
    res_cfg = cfg
    steps_epochs = res_cfg.trainer.batch_size / data.n_train  # one step
    res_cfg.trainer.epochs = steps_epochs
    init = []
    plan = training_plan(res_cfg)
    res = fit(plan, data, mechanism=mechanism_for(plan, dataset_size=data.n_train, delta=delta),
              tracker=Tracker(tmp_path, tensorboard=False), launch=LaunchConfig(randomness=randomness),
              on_engine=lambda e: init.append(torch.cat([p.detach().flatten().clone() for p in e.model.parameters()])))
    assert res.privacy["steps"] == 1
    after = torch.cat([p.detach().flatten() for p in res.model.parameters()])
    return init[0] - after, float(res_cfg.trainer.batch_size), data.n_train


def test_sweep_runs_do_not_share_noise_so_the_clipped_sum_stays_hidden(tmp_path):
    """Old behaviour: a sweep privacy.noise_multiplier=2,4 with one seed used one batch and one
    noise vector z in both runs; from the two one-step updates g_s = (S + s C z) / B the exact
    clipped sum S = B (4 g_2 - 2 g_4) / 2 follows (error ~1e-5). Today each run has its own
    streams (default), and with a seed file the two settings give two different labels."""
    shared = Randomness(mode="os", _entropy=secrets.randbits(256))
    truth, B, _ = _one_step_update(["privacy.noise_multiplier=0"], tmp_path, shared)  # S / B: no noise, same batch
    key = new_seed_file(tmp_path / "k")
    cases = {
        "old: shared streams": (shared, shared),
        "default: fresh streams": (Randomness.fresh(), Randomness.fresh()),
        "opt-in seed file": tuple(Randomness.from_seed_file(key, run_label=settings_digest(
            {"privacy": {"noise_multiplier": s}})) for s in (2.0, 4.0)),
    }
    errors = {}
    for name, (r2, r4) in cases.items():
        g2, _, _ = _one_step_update(["privacy.noise_multiplier=2.0"], tmp_path, r2)
        g4, _, _ = _one_step_update(["privacy.noise_multiplier=4.0"], tmp_path, r4)
        recovered = (4 * g2 - 2 * g4) / 2
        errors[name] = float((recovered - truth).norm() * B)
    noise_scale = 1.0 * truth.numel() ** 0.5  # C sqrt(d): the size of one noise vector times C
    assert errors["old: shared streams"] < 1e-3, errors
    assert errors["default: fresh streams"] > 0.5 * noise_scale, errors
    assert errors["opt-in seed file"] > 0.5 * noise_scale, errors


# ------------------------------------------------------------------------------ end to end


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


SMALL = ["experiment=logit", "data=synthetic", "data.n_rows=2000", "trainer.epochs=1", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=false", "trainer.checkpoint_every=5"]


def test_identical_default_commands_give_different_models_and_no_file_holds_the_streams(tmp_path, monkeypatch):
    """Two identical default commands produce different models. The entropy each run drew is
    recorded, and neither it nor the first words of the noise generator's state appear in any
    file of its run folder (in hex, decimal or raw bytes); the checkpoint holds no stream state."""
    drawn: list[int] = []
    real = rnd.secrets.randbits

    def recording(bits):
        v = real(bits)
        drawn.append(v)
        return v

    monkeypatch.setattr(rnd.secrets, "randbits", recording)
    models = []
    for name in ("a", "b"):
        cli.run(_compose(SMALL), run_dir=tmp_path / name)
        models.append(torch.load(tmp_path / name / "model.pt", weights_only=True)["state_dict"])
    assert len(drawn) == 2
    assert not all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    for name, entropy in zip(("a", "b"), drawn):
        words = Randomness(mode="os", _entropy=entropy)._sequence("gaussian-noise", 0).generate_state(4, np.uint32)
        needles = [f"{entropy:x}".encode(), str(entropy).encode(), entropy.to_bytes(32, "little"),
                   words.tobytes(), words.astype("<u8").tobytes()]
        files = [p for p in (tmp_path / name).rglob("*") if p.is_file()]
        assert any(p.name == "checkpoint.pt" for p in files)
        for p in files:
            blob = p.read_bytes()
            for needle in needles:
                assert needle not in blob, f"{p} holds the run's secret randomness"
        state = torch.load(tmp_path / name / "private" / "checkpoint.pt", weights_only=True)
        assert state["rng"]["noise"] is None and state["rng"]["sampler"] is None
        report = json.loads((tmp_path / name / "privacy.json").read_text())
        assert "operating system's CSPRNG" in report["randomness"] and "does not determine" in report["seed_role"]


def test_opt_in_seed_file_reproduces_and_says_so(tmp_path):
    key = new_seed_file(tmp_path / "secret.key")
    models = []
    for name in ("a", "b"):
        cli.run(_compose([*SMALL, f"privacy.noise_seed_file={key}"]), run_dir=tmp_path / name)
        models.append(torch.load(tmp_path / name / "model.pt", weights_only=True)["state_dict"])
        text = (tmp_path / name / "privacy.txt").read_text()
        assert "REPRODUCIBLE" in text and "REMOVE the noise" in text
        secret = key.read_text().strip()
        for p in (tmp_path / name).rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    # another setting of a sweep: another stream
    cli.run(_compose([*SMALL, f"privacy.noise_seed_file={key}", "privacy.noise_multiplier=1.5"]),
            run_dir=tmp_path / "c")
    other = torch.load(tmp_path / "c" / "model.pt", weights_only=True)["state_dict"]
    assert not all(torch.equal(models[0][k], other[k]) for k in other)


def test_a_bad_seed_file_is_refused_before_data_is_read(tmp_path, capsys):
    bad = tmp_path / "weak.key"
    bad.write_text("1234")
    with pytest.raises(SystemExit):
        cli.run(_compose([*SMALL[:1], "data=table", f"data.path={tmp_path / 'absent.csv'}", "data.target=y",
                          "++data.numeric={a: {lower: 0, upper: 1}}", f"privacy.noise_seed_file={bad}"]),
                run_dir=tmp_path / "run")
    err = capsys.readouterr().err
    assert "privacy.noise_seed_file" in err and "128 bits" in err and "absent.csv" not in err
    assert not Path(tmp_path / "run" / "privacy.json").exists()
