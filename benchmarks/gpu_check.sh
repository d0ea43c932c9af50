#!/usr/bin/env bash
# The GPU check: every stage of reproci on one CUDA GPU, in one call, in about 8 minutes.
#
# For a bare GPU machine that already has python3 with a CUDA torch, numpy, click, pyyaml and
# rich (no Docker engine, no docker SDK, no network): reproci runs from this checkout through
# PYTHONPATH on the local backend. pytest is installed from .cache/gpu-wheels when missing
# (fill it beforehand with: pip download pytest -d .cache/gpu-wheels).
#
#   bash benchmarks/gpu_check.sh                      # every part below, in order
#   bash benchmarks/gpu_check.sh tests bench          # some parts (env always runs first)
#
# A rehearsal on a machine without a GPU runs the same commands on the CPU at a small scale
# (quick profile, few steps, world size 2 over gloo), so that the script itself is proven
# before the GPU's minutes are spent on it:
#
#   REPROCI_GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh
#
# Parts: env, tests, bench, strict, compile, audit, ddp, throughput. Each has its own timeout, so that
# three calls of at most 10 minutes (tests bench | strict compile audit | throughput ddp) cover everything.
#
# 1. the environment (GPU, driver, torch, CUDA, cuDNN, NCCL);
# 2. tests/gpu/ (reference models on CUDA with -j 3, every optimizer state layout, AMP, real
#    CUDA nondeterminism caught, an op without a deterministic kernel, throughput on CUDA);
# 3. the per-step fingerprint cost on CUDA and the stage against a seed-style check;
# 4. the strict stage on the full profile (-j 3, world size 1) and the throughput stage on the full profile;
# 5. the strict stage compiled (inductor, Triton on CUDA: A, B, C and the warm-cache run W) and
#    under bf16 autocast, with the bisection on for any model that fails;
# 6. the op audit on CUDA: each attention call's predicted backend beside the one that ran, and
#    every determinism warning torch gave; the audit's fixes timed on CUDA;
# 7. the strict stage at world size 2 (DDP over NCCL, one GPU per rank) where two GPUs are visible.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$(mktemp -d)}
DEVICE=${REPROCI_GPU_CHECK_DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) echo "error: REPROCI_GPU_CHECK_DEVICE=$DEVICE: use cuda (the default) or cpu (a rehearsal)" >&2; exit 2;; esac
if [ "$DEVICE" = cuda ]; then
    PROFILE=full; BENCH_STEPS=60; STRICT=(); DDP=(--steps 100 --resume-at 50); TIMED=(); COMPILED=(--steps 40 --resume-at 20)
else  # the rehearsal: the same commands, small
    PROFILE=quick; BENCH_STEPS=8; STRICT=(--steps 8 --resume-at 4); DDP=(--steps 8 --resume-at 4 -m conv -m embedding)
    TIMED=(--steps 8 -m embedding); COMPILED=(--steps 4 --resume-at 2 -m embedding)
    export REPROCI_GPU_TEST_DEVICE=cpu
fi
start=$(date +%s)
status=0
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }
PARTS=" ${*:-tests bench strict compile audit throughput ddp} "
want() { [[ "$PARTS" == *" $1 "* ]]; }

step "environment"
"$PY" - "$DEVICE" <<'PY' || exit 5
import platform, subprocess, sys, torch
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:  # a build without NCCL
    nccl = None
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}")
if not torch.cuda.is_available():
    if sys.argv[1] == "cuda":
        raise SystemExit("torch sees no CUDA device: this check needs one "
                         "(REPROCI_GPU_CHECK_DEVICE=cpu rehearses it on the CPU)")
    print("rehearsal on the CPU: the same commands at a small scale, no figure here is a GPU's")
for i in range(torch.cuda.device_count()):
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}")
try:
    print("driver", subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30).stdout.strip())
except OSError:
    print("driver: nvidia-smi not found")
PY

if want tests; then
step "tests/gpu"
if ! "$PY" -c "import pytest" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --find-links .cache/gpu-wheels pytest 2>/dev/null \
        || echo "pytest is missing and .cache/gpu-wheels has none: tests/gpu skipped"
fi
if "$PY" -c "import pytest" 2>/dev/null; then
    # one process (-o addopts=""): pytest-xdist may be missing there
    timeout 420 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu -rs || status=1
fi
fi

if want bench; then
step "fingerprint cost on $DEVICE (every reference model) and stage wall time (embedding), $PROFILE profile"
timeout 150 "$PY" benchmarks/determinism_overhead.py --device "$DEVICE" --profile "$PROFILE" --steps "$BENCH_STEPS" \
    --stage-models embedding || status=1
fi

if want strict; then
step "strict stage, $PROFILE profile, -j 3, world size 1"
timeout 270 "$PY" -m reproci.cli run --device "$DEVICE" --profile "$PROFILE" "${STRICT[@]}" -j 3 --world-size 1 \
    --results-dir "$OUT/results" --goldens-dir "$OUT/goldens" || status=1
fi

if want compile; then
step "strict stage compiled (inductor) and under bf16 autocast, $PROFILE profile, ${COMPILED[1]} steps, --bisect"
timeout 300 "$PY" -m reproci.cli run --device "$DEVICE" --profile "$PROFILE" "${COMPILED[@]}" -j 3 --compile --bisect \
    --results-dir "$OUT/compiled" --goldens-dir "$OUT/goldens-compiled" || status=1
timeout 150 "$PY" -m reproci.cli run --device "$DEVICE" --profile "$PROFILE" "${COMPILED[@]}" -j 3 --amp bf16 --bisect \
    --results-dir "$OUT/bf16" --goldens-dir "$OUT/goldens-bf16" || status=1
fi

if want audit; then
step "op audit on $DEVICE: predicted against what ran; the fixes' cost on $DEVICE"
timeout 150 "$PY" -m reproci.cli run --device "$DEVICE" --stage audit -m conv -m transformer -m embedding \
    --results-dir "$OUT/audit" --goldens-dir "$OUT/goldens" >/dev/null || status=1
"$PY" - "$OUT/audit/latest.json" <<'PY' || status=1
import json, sys
for m in json.load(open(sys.argv[1]))["models"]:
    a = m.get("audit") or {}
    for f in a.get("findings") or []:
        ran = f" | ran: {', '.join(f['ran'])}" if "ran" in f else ""
        print(f"{m['model']}: {f['cuda']}: {f['op']}{ran}")
    for w in a.get("warnings") or []:
        print(f"{m['model']}: torch warned: {w}")
PY
timeout 120 "$PY" benchmarks/audit_fixes.py --device "$DEVICE" --reps 5 || status=1
fi

if want ddp; then
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${gpus:-0}" -ge 2 ] || [ "$DEVICE" = cpu ]; then
    step "strict stage at world size 2 (DDP, one device per rank), $PROFILE profile, ${DDP[1]} steps"
    timeout 400 "$PY" -m reproci.cli run --device "$DEVICE" --profile "$PROFILE" --world-size 2 "${DDP[@]}" \
        --results-dir "$OUT/ddp" --goldens-dir "$OUT/goldens-ddp" || status=1
else
    step "world size 2 skipped: this machine has ${gpus:-0} GPU(s), DDP over NCCL needs 2"
fi
fi

if want throughput; then
step "throughput stage, $PROFILE profile, 2 repetitions"
timeout 270 "$PY" -m reproci.cli run --device "$DEVICE" --profile "$PROFILE" "${TIMED[@]}" --stage throughput --repetitions 2 \
    --results-dir "$OUT/throughput" --goldens-dir "$OUT/goldens" || status=1
fi

step "done: exit $status"
exit $status
