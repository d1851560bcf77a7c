#!/usr/bin/env bash
# What the timeline trace (log.trace.steps) costs a step: pairs of runs of
# the same pp 2 x dp 1 job (1f1b, 4 micro-batches), one without tracing and
# one tracing every step after the first, interleaved (off on, on off, off
# on, ...) so load drifts and run order hit both sides alike. Per run: the median step_time_s over steps
# 2..STEPS from metrics.jsonl, and rank 0's CPU seconds per step (cpu_s,
# less sensitive to other load than wall time); reported: each pair's on/off
# ratios and their medians (goal <= 1.02), and the traced runs' spans per step.
#   [PAIRS=5] [STEPS=20] [LAYERS=4 D_MODEL=128 HEADS=4 SEQ=64 MB=4] bench/trace_overhead.sh
#     -> bench/results/trace_overhead.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
PAIRS="${PAIRS:-5}" STEPS="${STEPS:-20}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/trace_overhead.txt}"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "trace_overhead: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

tmp="$(mktemp -d /tmp/dtrain-trace-overhead-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = run name, $2.. = extra --set
  local dir="$tmp/$1"; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set cluster.procs_per_node=2 --set parallel.dp=1 --set parallel.pp=2 \
    --set parallel.pipeline.schedule=1f1b --set train.grad_accum=4 \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.steps="$STEPS" \
    --set train.warmup_steps=1 --set log.every=1 --set log.tensorboard=false \
    --set log.dir="$dir" --set checkpoint.dir='""' "${sets[@]}" \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "trace_overhead: run $1 failed" >&2; exit 1; }
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$PAIRS"); do
  if [ $((i % 2)) -eq 1 ]; then  # alternate which side runs first
    run "off$i"; run "on$i" "log.trace.steps=[2, $STEPS]"
  else
    run "on$i" "log.trace.steps=[2, $STEPS]"; run "off$i"
  fi
  echo "pair $i done" >&2
done

python3 - "$tmp" "$PAIRS" "$STEPS" "$OUT" "$LOAD0" "$LAYERS $D_MODEL $HEADS $SEQ $MB" <<'PY'
import json, os, statistics, sys, time
tmp, pairs, steps, out, load0, sizes = sys.argv[1:7]
pairs, steps = int(pairs), int(steps)

def per_step(run):
    """(median wall step_time_s, rank 0's CPU seconds per step) over steps 2..STEPS."""
    with open(os.path.join(tmp, run, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    wall = statistics.median(r["step_time_s"] for r in recs if r.get("step", 0) >= 2)
    cpu = {r["step"]: r["cpu_s"] for r in recs}
    return wall, (cpu[steps] - cpu[1]) / (steps - 1)

rows, ratios, cpu_ratios = [], [], []
for i in range(1, pairs + 1):
    (off, off_cpu), (on, on_cpu) = per_step(f"off{i}"), per_step(f"on{i}")
    ratios.append(on / off)
    cpu_ratios.append(on_cpu / off_cpu)
    rows.append(f"pair {i}: wall off {off * 1e3:8.2f} ms  on {on * 1e3:8.2f} ms  on/off {on / off:.4f}   "
                f"rank-0 CPU off {off_cpu * 1e3:8.2f} ms  on {on_cpu * 1e3:8.2f} ms  on/off {on_cpu / off_cpu:.4f}")
spans = 0
for r in range(2):
    with open(os.path.join(tmp, f"on{pairs}", "trace", f"rank_{r}.json")) as f:
        spans += len(json.load(f)["spans"])
med = statistics.median(ratios)
text = "\n".join([
    f"# bench/trace_overhead.sh, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    f"# pp 2 1f1b, 4 micro-batches, layers/d_model/heads/seq/micro_batch {sizes}, {steps} steps, "
    f"median step_time_s over steps 2..{steps}; load average at start {load0}, at end "
    f"{' '.join(open('/proc/loadavg').read().split()[:3])}",
    *rows,
    f"median on/off ratio: wall {med:.4f}, rank-0 CPU per step {statistics.median(cpu_ratios):.4f} "
    f"(goal <= 1.02; on a loaded machine the wall ratio swings by tens of percent, CPU time less); "
    f"the traced runs recorded "
    f"{spans / 2 / (steps - 1):.0f} spans per rank per step",
]) + "\n"
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f:
    f.write(text)
print(text, end="")
PY
