"""scripts/bench_step.py and scripts/gpu_check.sh: the benchmark's tables and JSON, its refusals,
and its CUDA code paths as far as a machine without a GPU can run them (no timing is asserted).

The CUDA path is checked on the CPU three ways: every mode's step runs with torch's default
device set to "meta" (a tensor created without naming the data's device would land there: the
bug that breaks a GPU run), the GPU memory measurement runs against stand-ins for
``torch.cuda``'s allocator statistics, and a mode raising ``torch.cuda.OutOfMemoryError`` is
reported as OOM while the other modes go on.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from test_device import DeviceAudit  # the same audit as the engine tests

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Opacus' backward-hook warnings

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_step.py"
MODES = ["nonprivate", "dptrain-fast", "dptrain-opacus", "opacus-hooks", "opacus-ghost"]


def _load():
    spec = importlib.util.spec_from_file_location("bench_step_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bs = _load()
TINY = bs.Case("tiny", 12, (8,), 32)


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """bench_case sets torch's thread count: give the other tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _quick_args(**over) -> Namespace:
    args = dict(modes=list(MODES), repeats=2, warmup_steps=2, min_warmup_steps=1, warmup_seconds=0.0,
                block_seconds=0.001, max_mode_seconds=1.0, contended=False, quick=True, no_memory=True,
                memory_steps=2, rows=None)
    args.update(over)
    return Namespace(**args)


def _run(*argv, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------------ the whole script


@pytest.mark.slow  # a real benchmark subprocess: seconds to tens of seconds on 2 cores
def test_quick_cpu_run_writes_a_table_and_json_with_every_case_mode_and_ratio(tmp_path):
    out = tmp_path / "x.md"
    res = _run("--quick", "--device", "cpu", "--cases", "mlp256-b1024", "preset-logit", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    table = out.read_text()
    header = next(line for line in table.splitlines() if line.startswith("| case |"))
    for col in ["nonprivate steps/s", *MODES[1:], "fast vs ghost", "load (1/5/15 min)"]:
        assert col in header
    names = [c.strip() for c in header.strip("|").split("|")]
    rows = {}
    for line in table.splitlines():
        if line.startswith(("| mlp256-b1024 |", "| preset-logit |")):
            cells = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
            rows[cells["case"]] = cells
    assert set(rows) == {"mlp256-b1024", "preset-logit"}
    for cells in rows.values():
        assert cells["threads"] == "1" and cells["B"] == "1024"
        for col in ["nonprivate steps/s", *MODES[1:], "fast vs ghost"]:
            assert float(cells[col]) > 0, (col, cells)  # a number: no OOM, ERR or "-"
        assert re.fullmatch(r"[\d.]+ [\d.]+ [\d.]+", cells["load (1/5/15 min)"])

    data = json.loads(out.with_suffix(".json").read_text())
    machine = data["machine"]
    assert machine["device"] == "cpu" and machine["torch"] == torch.__version__ and machine["opacus"]
    assert machine["loadavg_start"] and machine["loadavg_end"] and machine["cpu"]
    records = {r["case"]["name"]: r for r in data["records"]}
    assert set(records) == {"mlp256-b1024", "preset-logit"}
    # the preset's model and batch come from conf/ (experiment=logit on Adult: 111 features, B = 1024)
    preset = records["preset-logit"]["case"]
    assert (preset["in_features"], preset["hidden"], preset["batch"]) == (111, None, 1024)
    assert preset["source"] == "composed from experiment=logit"
    assert records["mlp256-b1024"]["case"]["hidden"] == [256, 256]
    for rec in records.values():
        assert rec["threads"] == 1 and rec["rows"] == 100_000
        modes = rec["phases"]["idle"]["modes"]
        assert list(modes) == MODES
        assert all(m["status"] == "ok" and m["steps_per_s"] > 0 and m["blocks"] >= 1 for m in modes.values())
        assert rec["phases"]["idle"]["loadavg_before"]
    # --render rebuilds the same tables from the JSON
    again = tmp_path / "again.md"
    assert bs.render(out.with_suffix(".json"), again) == 0
    rows_again = [ln for ln in again.read_text().splitlines() if ln.startswith("| ")]
    assert rows_again == [ln for ln in table.splitlines() if ln.startswith("| ")]


def test_cuda_without_a_gpu_is_refused_naming_the_option_and_what_is_allowed(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    res = _run("--device", "cuda", timeout=300)
    assert res.returncode == 2
    assert "--device cuda is not allowed here: torch sees no CUDA device" in res.stderr
    assert "allowed: --device cpu" in res.stderr
    for argv, message in [(["--device", "gpu"], "--device 'gpu' is not allowed: allowed: cpu | cuda | cuda:N"),
                          (["--device", "cuda:1"], "--device cuda:1 is not allowed here"),
                          (["--cases", "mlp9-b1"], "--cases mlp9-b1 is not allowed: allowed: logit-b256, ")]:
        with pytest.raises(SystemExit) as exc:
            bs.parse_args(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow  # a real benchmark subprocess: seconds to tens of seconds on 2 cores
def test_cpu_memory_probe_reports_the_peak_of_a_fresh_instance():
    spec = json.dumps({"case": {"name": "tiny", "in_features": 12, "hidden": [8], "batch": 32},
                       "mode": "dptrain-fast", "steps": 2, "rows": 1000})
    res = _run("--memory-probe", spec, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout.strip().splitlines()[-1])
    if "error" in data:
        pytest.skip(data["error"])  # a kernel without /proc/self/clear_refs
    assert data["status"] == "ok" and data["extra_mb"] >= 0 and data["peak_mb"] >= data["base_mb"]


def test_gpu_check_script_is_valid_bash_and_runs_every_part():
    script = REPO / "scripts" / "gpu_check.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    for part in ["tests/test_device.py", "tests/test_cuda.py", "scripts/bench_step.py --device cuda",
                 "scripts/bench_gpu_parts.py", "trainer.device=\"$dev\"", "summary.txt", "set -u"]:
        assert part in text
    # every part under a time limit, and the limits (set-up ~30 s on top) inside the device
    # tool's 600 s per command: (a) + (b) + (b2) + 2 x (c) + (c, torchrun)
    limits = [int(m) for m in re.findall(r"timeout -k 10 (\d+) ", text)]
    assert len(limits) == 5 and limits[0] + limits[1] + limits[2] + 2 * limits[3] + limits[4] + 30 <= 600, limits
    assert "-m torch.distributed.run --standalone --nproc_per_node=1" in text and "NCCL RUN CHECK" in text


# ------------------------------------------------------------------------------ the CUDA code path


def _audited_steps(step, n: int = 2) -> list:
    audit = DeviceAudit(torch.device("cpu"))
    with torch.device("meta"), audit:
        for _ in range(n):
            step()
    return audit.wrong


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_creates_its_tensors_on_the_data_device(mode):
    """On a GPU a tensor created without ``device=`` lands on the CPU and the step fails; here
    such a tensor would land on "meta" (the default device during the steps) and be reported."""
    x, y = bs.make_data(TINY, torch.device("cpu"), rows=500)
    step = bs.make_step(mode, TINY, x, y)
    assert _audited_steps(step, 3) == []  # 3 steps: the non-private permutation is drawn on the first
    assert _audited_steps(lambda: bs.sampler_cost(TINY.batch, x, y, seconds=0.001), 1) == []


def test_the_audit_catches_a_tensor_created_without_the_device():
    def careless_step():
        torch.zeros(3).add_(1)

    assert ("zeros", "meta") in _audited_steps(careless_step, 1)


def test_data_and_generators_follow_the_requested_device():
    with torch.device("meta"):
        x, y = bs.make_data(TINY, torch.device("cpu"), rows=300)
    assert x.device.type == y.device.type == "cpu" and x.shape == (300, 12)
    x2, _ = bs.make_data(TINY, torch.device("cpu"), rows=300)
    assert torch.equal(x, x2)  # seeded: the same rows in every process


def test_gpu_memory_measurement_against_allocator_stand_ins(monkeypatch):
    """measure_memory_cuda: base before the fresh instance's first step, peak of its steps,
    the transient of later steps; an out-of-memory mode gives status OOM and frees its objects."""
    calls, counters = [], {"allocated": 100 * 2**20, "peak": 0}

    def step_factory(mode, case, x, y):
        def step():
            counters["peak"] = max(counters["peak"], counters["allocated"] + 30 * 2**20)
            counters["allocated"] += 2**20 if mode == "dptrain-fast" else 0  # a persistent buffer
        return step

    def reset_peak(device):
        counters["peak"] = counters["allocated"]

    monkeypatch.setattr(bs, "make_step", step_factory)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: counters["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: counters["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset_peak)
    monkeypatch.setattr(bs, "free_memory", lambda device: calls.append("free"))
    x, y = torch.zeros(4, 12), torch.zeros(4)
    counters["allocated"] = 100 * 2**20
    rec = bs.measure_memory_cuda(TINY, "dptrain-fast", x, y, steps=3)
    assert rec["status"] == "ok"
    assert rec["base_mb"] == pytest.approx(102.0)  # the throw-away instance's 2 steps left 2 MB
    assert rec["extra_mb"] == pytest.approx(32.0) and rec["peak_mb"] == pytest.approx(134.0)
    assert rec["later_steps_extra_mb"] == pytest.approx(31.0)  # 2 more steps, one more buffer
    assert calls  # freed afterwards

    def oom_factory(mode, case, x, y):
        def step():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 275.00 GiB")
        return step

    monkeypatch.setattr(bs, "make_step", oom_factory)
    calls.clear()
    assert bs.measure_memory_cuda(TINY, "opacus-hooks", x, y, steps=3) == {"status": "OOM"}
    assert calls == ["free"]


def test_an_out_of_memory_mode_is_reported_as_oom_and_the_others_are_timed(monkeypatch):
    real = bs.make_step

    def make_step(mode, case, x, y):
        step = real(mode, case, x, y)
        if mode == "opacus-hooks":
            def step():  # noqa: F811
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB")
        if mode == "dptrain-opacus":
            def step():  # noqa: F811
                raise RuntimeError("CUDA error: out of memory")
        return step

    monkeypatch.setattr(bs, "make_step", make_step)
    x, y = bs.make_data(TINY, torch.device("cpu"), rows=400)
    memory = {m: {"status": "not measured"} for m in MODES}
    rec = bs.bench_case(TINY, x, y, _quick_args(), memory, threads=1, cell_budget=None)
    modes = rec["phases"]["idle"]["modes"]
    assert modes["opacus-hooks"] == {"status": "OOM"} and modes["dptrain-opacus"] == {"status": "OOM"}
    for m in ("nonprivate", "dptrain-fast", "opacus-ghost"):
        assert modes[m]["status"] == "ok" and modes[m]["steps_per_s"] > 0
    row = next(line for line in bs.ratio_table([rec], "idle", "cuda:0") if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5:8] == ["OOM", cells[6], "OOM"] and float(cells[6]) > 0 and float(cells[8]) > 0
    # a mode that ran out of memory in the memory measurement is not timed at all
    memory["opacus-ghost"] = {"status": "OOM"}
    rec = bs.bench_case(TINY, x, y, _quick_args(modes=["nonprivate", "opacus-ghost"]), memory, 1, None)
    assert rec["phases"]["idle"]["modes"]["opacus-ghost"] == {"status": "OOM"}
    memory_row = bs.cuda_memory_table([rec])[-1]
    assert "OOM" in memory_row


def test_contended_phase_reuses_the_steps_and_kills_its_competitor(monkeypatch):
    seen = []
    real = bs.competitor

    def watched():
        cm = real()

        class Wrap:
            def __enter__(self):
                self.hog = cm.__enter__()
                seen.append(self.hog)
                assert self.hog.poll() is None  # running during the contended phase
                return self.hog

            def __exit__(self, *exc):
                return cm.__exit__(*exc)

        return Wrap()

    monkeypatch.setattr(bs, "competitor", watched)
    x, y = bs.make_data(TINY, torch.device("cpu"), rows=400)
    args = _quick_args(modes=["nonprivate", "dptrain-fast"], contended=True)
    rec = bs.bench_case(TINY, x, y, args, {}, threads=1, cell_budget=None)
    assert set(rec["phases"]) == {"idle", "contended"}
    assert len(seen) == 1 and seen[0].poll() is not None  # killed afterwards
    lines = bs.contention_table([rec], "cpu")
    assert sum(line.startswith("| tiny |") for line in lines) == 2
    with pytest.raises(KeyError), real() as hog:
        raise KeyError("an error while the competitor runs")
    assert hog.poll() is not None  # killed on an error too


def test_repeats_shrink_to_the_budget_and_slow_modes_take_fewer_evenly_spaced_rounds():
    prepared = {"fast": {"k": 10, "t_step": 0.03}, "slow": {"k": 1, "t_step": 4.0}}
    args = _quick_args(repeats=7, max_mode_seconds=10.0)
    repeats, rounds = bs.plan_rounds(prepared, args, None)
    assert repeats == 7 and rounds["fast"] == list(range(7)) and rounds["slow"] == [0, 3]
    repeats, rounds = bs.plan_rounds(prepared, args, cell_budget=9.0)  # 0.3 R + 4 * 2 <= 9
    assert repeats == 3 and rounds["slow"] == [0, 1]
    repeats, _ = bs.plan_rounds(prepared, args, cell_budget=0.1)
    assert repeats == 2  # never below 2


# ------------------------------------------------------------------------------ scripts/bench_gpu_parts.py


def _load_parts():
    spec = importlib.util.spec_from_file_location("bench_gpu_parts_under_test", REPO / "scripts" / "bench_gpu_parts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_parts_prints_every_mode_as_a_ratio_to_the_nonprivate_step(capsys):
    parts = _load_parts()
    assert parts.main(["--device", "cpu", "--cases", "tiny", "--repeats", "2", "--rows", "600",
                       "--block-seconds", "0.001"]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^  (\S+)\s+([\d.]+) ms\s+([\d.]+)x", out, re.M)}
    assert list(rows) == parts.MODES
    assert rows["nonprivate"][1] == 1.0 and all(ms > 0 for ms, _ in rows.values())
    assert "## tiny: N = 600, B = 64" in out
    # the report's arithmetic on given times (no clock): medians, their ratio, the range
    times = {m: [2e-3, 1e-3, 3e-3] for m in parts.MODES}
    times["fast"] = [1.5e-3, 4.5e-3, 3e-3]
    lines = parts.report("tiny", times, 600, 64)
    assert lines[0].startswith("## tiny: N = 600, B = 64")
    row = {ln.split()[0]: ln.split()[1:] for ln in lines[1:]}
    assert row["nonprivate"] == ["2.000", "ms", "1.000x", "(1.000-3.000)"]
    assert row["fast"] == ["3.000", "ms", "1.500x", "(1.500-4.500)"]


@pytest.mark.parametrize("mode", ["nonprivate", "nonprivate-poisson", "fast", "fast-eager", "fast-device-sampler",
                                  "fast-cpu-layout", "fast-presampled", "sampler", "device-sampler"])
def test_gpu_parts_modes_create_their_tensors_on_the_data_device(mode):
    parts = _load_parts()
    x, y = parts.make_data("tiny", torch.device("cpu"), rows=400)
    assert x.shape == (400, 8) and y.shape == (400,)
    step = parts.make_step(mode, "tiny", x, y)
    assert _audited_steps(step, 3) == []


def test_gpu_parts_layouts_are_the_ones_named(capsys):
    """fast-cpu-layout is the buffered path with the ones column, fast the GPU's layout (on a
    CPU the engine's default is the ones column: the script sets it either way)."""
    parts = _load_parts()
    x, y = torch.rand(400, 8), (torch.rand(400) > 0.5).float()
    layouts = {}
    for mode in ("fast-cpu-layout", "fast"):
        step = parts.make_step(mode, "tiny", x, y)
        cells = [c.cell_contents for c in step.__closure__]
        engine = next(c.engine if type(c).__name__ == "BatchStep" else c for c in cells
                      if type(c).__name__ in ("FastLinearEngine", "BatchStep"))
        step()
        layouts[mode] = (engine.ones_column, engine._ws.ones_column)
    assert layouts == {"fast-cpu-layout": (True, True), "fast": (False, False)}
    # the samplers are the ones named: make_sampler's (numpy on this CPU) and the GPU-drawing one
    from dptrain.privacy.dpsgd.sampling import DevicePoissonSampler, PoissonSampler

    kinds = {}
    for mode in ("fast", "fast-eager", "fast-device-sampler", "sampler", "device-sampler"):
        f = parts.make_step(mode, "tiny", x, y)
        if hasattr(f, "__self__"):
            sampler = f.__self__
        else:
            cells = [c.cell_contents for c in f.__closure__]
            sampler = next(c.sampler if type(c).__name__ == "BatchStep" else c for c in cells
                           if "Sampler" in type(c).__name__ or type(c).__name__ == "BatchStep")
        kinds[mode] = type(sampler)
    assert kinds == {"fast": PoissonSampler, "fast-eager": PoissonSampler, "fast-device-sampler": DevicePoissonSampler,
                     "sampler": PoissonSampler, "device-sampler": DevicePoissonSampler}
    with pytest.raises(SystemExit):
        parts.main(["--device", "cpu", "--repeats", "0"])
    assert "--repeats 0 is not allowed" in capsys.readouterr().err
