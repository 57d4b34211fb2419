#!/usr/bin/env bash
# The GPU checks of trainer.device (issue 17) in one go, on a machine with one CUDA GPU.
#
#   OUT=/some/empty/folder bash scripts/gpu_check.sh        # from the repository root
#
# Runs, in order, each under `timeout`, each writing its log into $OUT, going on after a failure:
#   (a) pytest tests/test_device.py tests/test_cuda.py        -> $OUT/a_pytest.log
#   (b) scripts/bench_step.py --device cuda (the issue's six cases, ~2-4 min), then
#       scripts/bench_gpu_parts.py (the DP step taken apart, ~1 min; appended to b_bench.log)
#                                                             -> $OUT/b_bench.log, bench_cuda.md, bench_cuda.json
#   (c) python -m dptrain experiment=mlp for exactly 2 steps, trainer.device=cuda and =cpu, and the
#       same under torchrun (one process, trainer.distributed=true: NCCL); then the runs'
#       privacy.json "epsilon" and "steps" side by side and whether they are equal
#                                                             -> $OUT/c_runs.log, c_privacy.json
# and ends with PASS/FAIL per part in $OUT/summary.txt (also printed). Set-up (nvidia-smi, versions,
# installs) goes to $OUT/setup.log. That is 8 files: the device tool returns at most 8 files from
# $OUT, at most 2 folders down, so the two training runs write their folders under $RUN_ROOT
# (default /tmp/gpu_check_runs), not under $OUT, and only their privacy.json come back (c_privacy.json).
#
# Time (under 10 min at worst, the device tool's command limit; about 3.5 min measured on an H100):
# set-up ~0.5 min, (a) <= 80 s, (b) <= 200 s + 60 s, (c) <= 2 x 60 s + 70 s.
#
# Two steps: dptrain runs steps = round(epochs * N / B) (dptrain.privacy.mechanism: round(epochs / q),
# q = B / N). experiment=mlp trains on Adult's N = 32,561 training rows (privacy.json "dataset_size",
# read off a CPU run of this command) with B = 1,024, so epochs = 0.0629 gives
# round(0.0629 * 32561 / 1024) = round(2.0001) = 2 steps (any epochs in [0.0472, 0.0786) would).
set -u

OUT=${OUT:?set OUT to an empty folder for the logs}
mkdir -p "$OUT"
ROOT=$(pwd)
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || PY=python
RUN_ROOT=${RUN_ROOT:-/tmp/gpu_check_runs}
EPOCHS_FOR_2_STEPS=0.0629
export PYTHONUNBUFFERED=1
SETUP="$OUT/setup.log"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

record() {  # record PART RC [NOTE]: PASS for rc 0, else FAIL (124: the timeout hit)
    local part=$1 rc=$2 note=${3:-} verdict=PASS
    [ "$rc" -eq 0 ] || verdict=FAIL
    [ "$rc" -eq 124 ] && note="timed out${note:+; $note}"
    echo "$part: $verdict (rc=$rc${note:+; $note})" | tee -a "$SUMMARY"
}

# ------------------------------------------------------------------------------------ set-up
{
    echo "== $(date -u +%FT%TZ) in $ROOT"
    nvidia-smi || echo "nvidia-smi failed (rc=$?)"
    echo "== python: $(command -v "$PY")"
    "$PY" --version
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$PY" -c "import torch; print(torch.cuda.is_available())"
    echo "== /proc/loadavg: $(cat /proc/loadavg); cpus: $(nproc)"
    # dptrain's dependencies (opacus, hydra-core, dp-accounting, ...) from wheels carried in .whl/,
    # when the image lacks them
    if ! "$PY" -c "import opacus, hydra, omegaconf, dp_accounting" 2>/dev/null && [ -d .whl ]; then
        echo "== installing the wheels in .whl/ into /tmp/site"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    # dptrain itself: `python -m dptrain` needs the package dptrain.conf (conf/), which only an
    # install maps; check from outside the checkout that the import is THIS checkout's code
    check_install() {
        (cd / && "$PY" - "$ROOT" <<'EOF'
import os, sys
import dptrain, dptrain.conf
root = os.path.realpath(sys.argv[1])
where = os.path.realpath(dptrain.__file__)
print("dptrain imported from", where)
sys.exit(0 if where.startswith(root + os.sep) else 1)
EOF
        )
    }
    if ! check_install; then
        echo "== pip install --no-deps -e . (offline: --no-build-isolation first)"
        "$PY" -m pip install -q --no-deps --no-build-isolation -e . || "$PY" -m pip install -q --no-deps -e .
        check_install || echo "WARNING: dptrain still does not import from this checkout"
    fi
    "$PY" -c "import opacus, hydra, dptrain; print('opacus', opacus.__version__, 'hydra', hydra.__version__)"
} >"$SETUP" 2>&1
cat "$SETUP"
check_rc=0
(cd / && "$PY" -c "import dptrain.conf, opacus, torch; assert torch.cuda.is_available()") >>"$SETUP" 2>&1 \
    || check_rc=$?
record "setup (dptrain + opacus import, CUDA available)" "$check_rc" "see setup.log"

# ------------------------------------------------------------------------- (a) the GPU tests
tests=(tests/test_device.py)
note=""
if [ -f tests/test_cuda.py ]; then tests+=(tests/test_cuda.py); else note="tests/test_cuda.py is missing"; fi
timeout -k 10 80 "$PY" -m pytest -q -p no:cacheprovider -rs "${tests[@]}" >"$OUT/a_pytest.log" 2>&1
rc=$?
[ -z "$note" ] || { [ "$rc" -eq 0 ] && rc=1; }
tail -n 15 "$OUT/a_pytest.log"
record "a pytest ${tests[*]}" "$rc" "$note"

# ------------------------------------------------------------------------ (b) the benchmark
# the six cases with 5 repeats of ~0.3 s blocks per mode; --budget-seconds lowers the repeats
# (never below 2) if the timed blocks would not fit in 100 s (data, memory and warm-up come on top)
timeout -k 10 200 "$PY" scripts/bench_step.py --device cuda --repeats 5 --budget-seconds 100 \
    --out "$OUT/bench_cuda.md" >"$OUT/b_bench.log" 2>&1
rc=$?
tail -n 40 "$OUT/b_bench.log"
note="see b_bench.log, bench_cuda.md"
if [ ! -f "$OUT/bench_cuda.md" ]; then
    note="no bench_cuda.md"
elif grep -q "PARTIAL" "$OUT/bench_cuda.md"; then
    note="bench_cuda.md holds only the cases finished before the stop"
fi
record "b bench_step --device cuda" "$rc" "$note"
# the step taken apart (dptrain's layouts, the sampler's cost), in the same log
echo "== scripts/bench_gpu_parts.py --repeats 3" >>"$OUT/b_bench.log"
timeout -k 10 60 "$PY" scripts/bench_gpu_parts.py --repeats 3 >>"$OUT/b_bench.log" 2>&1
rc=$?
grep -E "^##|^  [a-z-]+ " "$OUT/b_bench.log" | tail -n 30
record "b2 bench_gpu_parts" "$rc" "see b_bench.log"

# ------------------------------------------------ (c) the same 2-step run on the GPU and the CPU
rm -rf "$RUN_ROOT"
mkdir -p "$RUN_ROOT"
: >"$OUT/c_runs.log"
for dev in cuda cpu; do
    echo "== python -m dptrain experiment=mlp trainer.device=$dev trainer.epochs=$EPOCHS_FOR_2_STEPS" >>"$OUT/c_runs.log"
    timeout -k 10 60 "$PY" -m dptrain experiment=mlp trainer.device="$dev" trainer.epochs=$EPOCHS_FOR_2_STEPS \
        trainer.progress=false hydra.run.dir="$RUN_ROOT/run_$dev" >>"$OUT/c_runs.log" 2>&1
    echo "== rc=$? (trainer.device=$dev)" >>"$OUT/c_runs.log"
done
# the same command under torchrun with trainer.distributed=true: one process on the one GPU, so
# the NCCL process group, its all_reduce and the noise-once rule run on CUDA tensors (several GPUs
# are needed for more than one rank: NCCL refuses two ranks on one device)
echo "== torchrun --nproc_per_node=1 -m dptrain experiment=mlp trainer.distributed=true trainer.device=cuda" >>"$OUT/c_runs.log"
timeout -k 10 70 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m dptrain experiment=mlp \
    trainer.distributed=true trainer.device=cuda trainer.epochs=$EPOCHS_FOR_2_STEPS trainer.progress=false \
    hydra.run.dir="$RUN_ROOT/run_nccl" >>"$OUT/c_runs.log" 2>&1
echo "== rc=$? (torchrun, trainer.distributed=true, trainer.device=cuda)" >>"$OUT/c_runs.log"
"$PY" - "$RUN_ROOT" "$OUT/c_privacy.json" >>"$OUT/c_runs.log" 2>&1 <<'EOF'
import json, math, sys
from pathlib import Path
root, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for dev in ("cuda", "cpu", "nccl"):
    f = root / f"run_{dev}" / "privacy.json"
    runs[dev] = json.loads(f.read_text()) if f.exists() else None
    r = runs[dev] or {}
    print(f"{dev}: epsilon={r.get('epsilon')!r} steps={r.get('steps')!r} device={r.get('device')!r} "
          f"dataset_size={r.get('dataset_size')!r}" + ("" if runs[dev] else f"  (no {f})"))
out.write_text(json.dumps(runs, indent=1) + "\n")
a, b = runs["cuda"], runs["cpu"]
ok = bool(a and b)
if ok:
    same_eps = a["epsilon"] == b["epsilon"]
    close_eps = math.isclose(a["epsilon"], b["epsilon"], rel_tol=1e-12)
    print(f"epsilon equal: {same_eps} (within 1e-12 relative: {close_eps}); steps equal: {a['steps'] == b['steps']} "
          f"({a['steps']} and {b['steps']}; 2 planned); cuda run's device: {a.get('device')!r}")
    ok = close_eps and a["steps"] == b["steps"] == 2 and str(a.get("device", "")).startswith("cuda")
print("SAME EPSILON CHECK:", "PASS" if ok else "FAIL")
c = runs["nccl"]
nccl_ok = bool(c and b) and math.isclose(c["epsilon"], b["epsilon"], rel_tol=1e-12) and c["steps"] == 2 \
    and (c.get("distributed") or {}).get("backend") == "nccl" and str(c.get("device", "")).startswith("cuda")
print(f"nccl: distributed={(c or {}).get('distributed')!r}")
print("NCCL RUN CHECK:", "PASS" if nccl_ok else "FAIL")
sys.exit(0 if ok and nccl_ok else 1)
EOF
rc=$?
grep -E "^(cuda|cpu|nccl):|epsilon equal|SAME EPSILON|NCCL RUN|== rc=" "$OUT/c_runs.log"
record "c experiment=mlp 2 steps, cuda vs cpu (and torchrun + NCCL): same epsilon and steps" "$rc" "see c_runs.log"

echo "== $(date -u +%FT%TZ); load $(cat /proc/loadavg)" >>"$SUMMARY"
echo "== summary ($SUMMARY)"
cat "$SUMMARY"
ls -la "$OUT"
