#!/usr/bin/env bash
# shellcheck disable=SC2317  # the lanes are called as lane_$NAME
# The GPU check: every stage of reproci on one CUDA GPU, in one call of at most 8 minutes.
#
# For a bare GPU machine that already has python3 with a CUDA torch, numpy, click, pyyaml and
# rich (no Docker engine, no docker SDK, no network): reproci runs from this checkout through
# PYTHONPATH on the local backend. pytest is installed from .cache/gpu-wheels when missing
# (fill it beforehand with: pip download pytest -d .cache/gpu-wheels).
#
#   bash benchmarks/gpu_check.sh
#
# First the correctness lanes, side by side on the one GPU (each its own processes; a lane that
# fails does not stop the others), then the timings alone, so that nothing else shares the GPU:
#
#   tests     tests/gpu/ (reference models -j 3, every optimizer state layout, AMP, real CUDA
#             nondeterminism caught, ops without a deterministic kernel, throughput on CUDA);
#   strict    the strict stage on the full profile (-j 3, world size 1), the op audit (each
#             attention call's predicted backend beside the one that ran, torch's determinism
#             warnings), a script model (a nanoGPT-style train.py run unchanged, on the device),
#             the strict stage under bf16 autocast (--bisect);
#   compile   the strict stage compiled (inductor, Triton: A, B, C and the warm-cache run W, --bisect);
#   zoo       a sample of benchmarks/zoo.py (transformers, peft, Lightning with torchmetrics) on the device;
#   ddp       the strict stage at world size 2 (DDP over NCCL), only where two GPUs are visible;
#   record    the per-step record's cost (benchmarks/determinism_overhead.py: the reference models
#             and GPT-2 small where the benchmark has it);
#   throughput  the throughput stage, quick profile.
#
# Each lane's full log is NAME.log in the results folder ($OUT when set, else
# results/gpu-check-DATE); summary.txt there has one line per lane: passed or failed, its
# seconds and its key figures. Exit 0 when every lane passed, else 1; 5 when torch sees no GPU.
#
# A rehearsal on a machine without a GPU runs the same lanes on the CPU at a small scale (quick
# profile, few steps), so that the script itself is proven before the GPU's minutes are spent:
#
#   REPROCI_GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh
#
# PYTHON names the interpreter (default python3); REPROCI_GPU_CHECK_BUDGET the seconds of the
# whole run (default 470), of which REPROCI_GPU_CHECK_LANES the lanes' share (default 270).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEVICE=${REPROCI_GPU_CHECK_DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) echo "error: REPROCI_GPU_CHECK_DEVICE=$DEVICE: use cuda (the default) or cpu (a rehearsal)" >&2; exit 2;; esac
RESULTS=${OUT:-results/gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RESULTS" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
if [ "$DEVICE" = cuda ]; then
    PROFILE=full; BENCH_STEPS=60; STRICT=(); COMPILED=(--steps 40 --resume-at 20); DDP=(--steps 100 --resume-at 50)
    ZOO=(--steps 6 --resume-at 3); RECORD_MODELS=(conv transformer embedding gpt2_small); TIMING_S=150; BUDGET=${REPROCI_GPU_CHECK_BUDGET:-470}; LANES=${REPROCI_GPU_CHECK_LANES:-270}
else  # the rehearsal: the same lanes, small, and no limit that a 2-core machine cannot keep
    PROFILE=quick; BENCH_STEPS=8; STRICT=(--steps 8 --resume-at 4); COMPILED=(--steps 4 --resume-at 2 -m embedding)
    DDP=(--steps 8 --resume-at 4 -m embedding); ZOO=(--steps 4 --resume-at 3)  # k = 3: inside epoch 1 (2 batches an epoch)
    RECORD_MODELS=(conv transformer embedding)  # GPT-2 small (124 M) takes minutes a step on 2 cores
    TIMING_S=300  # each timing lane: on 2 cores the throughput stage alone takes 140 s on a quiet machine
    BUDGET=${REPROCI_GPU_CHECK_BUDGET:-3600}; LANES=${REPROCI_GPU_CHECK_LANES:-2400}
    export REPROCI_GPU_TEST_DEVICE=cpu
fi
# The zoo's sample on the device: one entry of each family, the Lightning CNN whose metric state a
# resume restores, and a planted bug; Wav2Vec2ForCTC stops in strict mode on CUDA (tests/gpu checks its advice).
ZOO_SAMPLE=(hf_text.gpt2 hf_vision.resnet lora.gpt2_lora lightning_zoo.cnn_datamodule planted.bert_collator_rng)
start=$(date +%s)
lanes_end=$(( start + LANES ))
run_end=$(( start + BUDGET ))

# within SECONDS END CMD...: CMD under timeout, at most SECONDS and never past END (an epoch second).
within() {
    local s=$1 end=$2 left
    shift 2
    left=$(( end - $(date +%s) ))
    if (( left < s )); then s=$left; fi
    if (( s < 5 )); then echo "no time left for: $*"; return 124; fi
    timeout "$s" "$@"
}

# reproci run on the device, from this checkout (a command, not a function: timeout runs it).
REPROCI=("$PY" -m reproci.cli run --device "$DEVICE")

lane_tests() {
    if ! "$PY" -c "import pytest" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --find-links .cache/gpu-wheels pytest 2>/dev/null \
            || { echo "pytest is missing and .cache/gpu-wheels has none: tests/gpu not run"; return 1; }
    fi
    # one process (-o addopts=""): pytest-xdist may be missing there
    within 260 "$lanes_end" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu -rs
}

lane_strict() {
    local rc=0
    echo "== strict stage, $PROFILE profile, -j 3, world size 1"
    within 170 "$lanes_end" "${REPROCI[@]}" --profile "$PROFILE" "${STRICT[@]}" -j 3 --world-size 1 \
        --results-dir "$RESULTS/strict" --goldens-dir "$RESULTS/goldens" || rc=1
    echo "== op audit: predicted against what ran"
    within 60 "$lanes_end" "${REPROCI[@]}" --stage audit -m conv -m transformer -m embedding \
        --results-dir "$RESULTS/audit" --goldens-dir "$RESULTS/goldens" >/dev/null || rc=1
    "$PY" - "$RESULTS/audit/latest.json" <<'PY' || rc=1
import json, sys
for m in json.load(open(sys.argv[1]))["models"]:
    a = m.get("audit") or {}
    for f in a.get("findings") or []:
        ran = f" | ran: {', '.join(f['ran'])}" if "ran" in f else ""
        print(f"{m['model']}: {f['cuda']}: {f['op']}{ran}")
    for w in a.get("warnings") or []:
        print(f"{m['model']}: torch warned: {w}")
PY
    echo "== a script model, unchanged (tests/scripts/nanogpt_train.py on the device): its own resume, RNG saved"
    local train="python tests/scripts/nanogpt_train.py --device=$DEVICE --max_iters={steps} --out_dir={out} --eval_interval={resume_at} --save_rng=True"
    within 90 "$lanes_end" "${REPROCI[@]}" --script "$train" --resume-script "$train --init_from=resume" --name nanogpt \
        --steps 8 --resume-at 4 --results-dir "$RESULTS/script" --goldens-dir "$RESULTS/goldens" || rc=1
    echo "== strict stage under bf16 autocast, ${COMPILED[1]} steps, --bisect"
    within 90 "$lanes_end" "${REPROCI[@]}" --profile "$PROFILE" "${COMPILED[@]}" -j 3 --amp bf16 --bisect \
        --results-dir "$RESULTS/bf16" --goldens-dir "$RESULTS/goldens-bf16" || rc=1
    return "$rc"
}

lane_compile() {
    within 260 "$lanes_end" "${REPROCI[@]}" --profile "$PROFILE" "${COMPILED[@]}" -j 3 --compile --bisect \
        --results-dir "$RESULTS/compile" --goldens-dir "$RESULTS/goldens-compiled"
}

lane_zoo() {
    mkdir -p "$RESULTS/zoo" && printf 'device: %s\n' "$DEVICE" >"$RESULTS/zoo/reproci.yaml"
    within 260 "$lanes_end" "$PY" benchmarks/zoo.py --only "${ZOO_SAMPLE[@]}" "${ZOO[@]}" --jobs 3 \
        --work "$RESULTS/zoo" --json "$RESULTS/zoo/summary.json"
}

lane_ddp() {
    within 260 "$lanes_end" "${REPROCI[@]}" --profile "$PROFILE" --world-size 2 "${DDP[@]}" \
        --results-dir "$RESULTS/ddp" --goldens-dir "$RESULTS/goldens-ddp"
}

lane_record() {
    local models=("${RECORD_MODELS[@]}") rc=0
    within "$TIMING_S" "$run_end" "$PY" benchmarks/determinism_overhead.py --device "$DEVICE" --profile "$PROFILE" \
        --steps "$BENCH_STEPS" --models "${models[@]}" || rc=$?
    if (( rc != 0 && rc != 124 )) && grep -qi "gpt2_small" "$RESULTS/record.log"; then
        echo "gpt2_small: this checkout's benchmark does not run it (above); the reference models alone:"
        rc=0
        within 120 "$run_end" "$PY" benchmarks/determinism_overhead.py --device "$DEVICE" --profile "$PROFILE" \
            --steps "$BENCH_STEPS" --models conv transformer embedding || rc=$?
    fi
    return "$rc"
}

lane_throughput() {
    local budget=()
    if "${REPROCI[@]}" --help 2>/dev/null | grep -q -- "--time-budget"; then budget=(--time-budget 60); fi
    within "$TIMING_S" "$run_end" "${REPROCI[@]}" --profile quick --stage throughput "${budget[@]}" \
        --results-dir "$RESULTS/throughput" --goldens-dir "$RESULTS/goldens"
}

# lane NAME: lane_NAME's output in NAME.log, "exit-code seconds" in NAME.status.
lane() {
    local t0 rc=0
    export PYTHONUNBUFFERED=1  # a lane stopped by its time limit still shows what it printed
    t0=$(date +%s)
    "lane_$1" >"$RESULTS/$1.log" 2>&1 || rc=$?
    echo "$rc $(( $(date +%s) - t0 ))" >"$RESULTS/$1.status"
    echo "$1: exit $rc after $(( $(date +%s) - t0 )) s (log: $RESULTS/$1.log)"
}

echo "== environment"
"$PY" - "$DEVICE" <<'PY' | tee "$RESULTS/environment.log" || exit 5
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
    print("rehearsal on the CPU: the same lanes at a small scale, no figure here is a GPU's")
for i in range(torch.cuda.device_count()):
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}")
try:
    print("driver", subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30).stdout.strip())
except OSError:
    print("driver: nvidia-smi not found")
PY

gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
LANE_NAMES=(tests strict compile zoo)
if [ "${gpus:-0}" -ge 2 ]; then LANE_NAMES+=(ddp); fi
echo "== correctness lanes side by side: ${LANE_NAMES[*]} (until +$LANES s); logs in $RESULTS"
for name in "${LANE_NAMES[@]}"; do lane "$name" & done
wait
echo "== timings alone: record, throughput"
lane record
lane throughput

"$PY" - "$RESULTS" "$(( $(date +%s) - start ))" "${LANE_NAMES[@]}" record throughput <<'PY' | tee "$RESULTS/summary.txt"
"""One line per lane: passed or failed, seconds, key figures (read from its results and its log)."""
import json, re, sys
from pathlib import Path

results, total, lanes = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]


def doc(name):
    try:
        return json.loads((results / name / "latest.json").read_text())
    except (OSError, ValueError):
        return None


def verdicts(name):
    d = doc(name)
    return f"{name}: " + (", ".join(f"{m['model']} {m['verdict']}" for m in d["models"]) if d else "no results")


def log(name):
    try:
        return (results / f"{name}.log").read_text(errors="replace")
    except OSError:
        return ""


def figures(name):
    if name == "tests":
        found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?)(?: =*)?$", log(name), re.M)
        return found[-1] if found else "no pytest summary"
    if name == "strict":
        d = doc("audit")
        audit = f"audit: {sum(len((m.get('audit') or {}).get('findings') or []) for m in d['models'])} findings" \
            if d else "audit: no results"
        return "; ".join((verdicts("strict"), audit, verdicts("script"), verdicts("bf16")))
    if name in ("compile", "ddp"):
        return verdicts(name)
    if name == "zoo":
        try:
            z = json.loads((results / "zoo" / "summary.json").read_text())
        except (OSError, ValueError):
            return "no zoo summary"
        bad = [e["name"] for e in z["entries"] if not e.get("ok") and not e.get("skipped")]
        return (f"{z['architectures']['pass']}/{z['architectures']['total']} architectures PASS, planted "
                f"{z['planted']['as_expected']}/{z['planted']['total']} as expected"
                + (f"; not as expected: {', '.join(bad)}" if bad else ""))
    if name == "record":
        lines = [line.strip() for line in log(name).splitlines() if " record: " in line or "% of" in line]
        return " | ".join(lines[:8]) or "no figures in the log"
    if name == "throughput":
        d = doc("throughput")
        if not d:
            return "no results"
        out = []
        for m in d["models"]:
            t = m.get("throughput") or {}
            median = (t.get("slowdown") or {}).get("median")
            said = t.get("stopped") or t.get("stop") or ""
            out.append(f"{m['model']} {median:.3f}x{' ' + str(said) if said else ''}" if median else f"{m['model']} -")
        return "strict/default " + ", ".join(out)
    return ""


for name in lanes:
    try:
        rc, seconds = (results / f"{name}.status").read_text().split()
    except (OSError, ValueError):
        rc, seconds = "-", "-"
    state = "passed" if rc == "0" else "failed"
    try:
        said = figures(name)
    except Exception as e:  # noqa: BLE001 - a figure that cannot be read is said, the line still written
        said = f"figures unreadable: {type(e).__name__}: {e}"
    print(f"{name:<11} {state:<6} {seconds:>4} s  {said}")
print(f"{'total':<11} {'':<6} {total:>4} s  results and logs: {results}")
PY

status=0
for name in "${LANE_NAMES[@]}" record throughput; do
    read -r rc _ <"$RESULTS/$name.status" || rc=1
    if [ "$rc" != 0 ]; then status=1; fi
done
echo "== done after $(( $(date +%s) - start )) s: exit $status (summary: $RESULTS/summary.txt)"
exit $status
