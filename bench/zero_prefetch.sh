#!/usr/bin/env bash
# ZeRO-3 prefetch on vs off at dp 4: parallel.fsdp.prefetch starts the next
# unit's all-gather while this unit computes (forward: unit + 1, backward:
# unit - 1, and unit 0 of the next step after the optimizer). Runs are
# interleaved (on, off, on, off, ...) so drift hits both; per run the median
# step_time_s and sync_wait_s (exposed reduce-scatter + gather wait) of the
# steady steps (from step 6 on). ratio = step(off) / step(on): > 1 means
# prefetch helps. With 4 ranks on 2 cores, compute and communication share
# the same cores, so there is little to overlap into: expect a small gain.
#   [ROUNDS=6] [STEPS=30] [DP=4] [D_MODEL=128 HEADS=4 LAYERS=4 SEQ=64 MB=4] bench/zero_prefetch.sh
#     -> bench/results/zero_prefetch.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
ROUNDS="${ROUNDS:-6}"
STEPS="${STEPS:-30}"
DP="${DP:-4}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/zero_prefetch.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "zero_prefetch: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "zero_prefetch: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 10 ] || { echo "zero_prefetch: STEPS must be >= 10 (steps 6.. are the steady ones)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

tmp="$(mktemp -d /tmp/dtrain-zero-prefetch-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = on|off, $2 = round
  local dir="$tmp/$1$2" flag=true
  [ "$1" = off ] && flag=false
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set parallel.zero=3 --set parallel.fsdp.prefetch="$flag" \
    --set parallel.dp="$DP" --set cluster.procs_per_node="$DP" \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.steps="$STEPS" \
    --set train.warmup_steps=5 --set log.every=1 --set log.dir="$dir" --set checkpoint.dir='""' \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "zero_prefetch: prefetch $1 round $2 failed" >&2; exit 1; }
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  run on "$r"
  run off "$r"
  echo "round $r done" >&2
done
LOAD1="$(cut -d' ' -f1-3 /proc/loadavg)"

CMD="ROUNDS=$ROUNDS STEPS=$STEPS DP=$DP LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB bench/zero_prefetch.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$LOAD1" "$ROUNDS $DP $LAYERS $D_MODEL $HEADS $SEQ $MB $STEPS" <<'EOF'
import json, os, statistics, sys, time
tmp, out_path, cmd, load0, load1, sizes = sys.argv[1:7]
rounds, n, layers, C, heads, T, mb, steps = (int(x) for x in sizes.split())

def stats(name):
    recs = [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
    st = [r for r in recs if r["step"] >= 6]
    return (statistics.median(r["step_time_s"] for r in st), statistics.median(r["sync_wait_s"] for r in st),
            statistics.median(r["loss"] for r in recs if r["step"] == steps), len(st))

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/zero_prefetch.sh: ZeRO-3 parallel.fsdp.prefetch on vs off, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {layers} d_model {C} heads {heads} seq_len {T}, dp {n} (gloo), {n} ranks on {os.cpu_count()} cores, "
    f"1 thread/rank, micro_batch {mb}, {steps} steps; per run the median of steps 6..{steps}; rounds interleaved")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {load1}")
say(f"# wait = sync_wait_s: time blocked on gathers and reduce-scatters; ratio = step_off / step_on")
say(f"# reproduce: {cmd}")
say(f"{'round':<6} {'step_on_ms':>11} {'step_off_ms':>12} {'wait_on_ms':>11} {'wait_off_ms':>12} {'ratio':>7} "
    f"{'loss_on':>8} {'loss_off':>8}")
ratios, on_s, off_s, hidden = [], [], [], []
for r in range(1, rounds + 1):
    s_on, w_on, l_on, _ = stats(f"on{r}")
    s_off, w_off, l_off, _ = stats(f"off{r}")
    ratios.append(s_off / s_on)
    on_s.append(s_on)
    off_s.append(s_off)
    hidden.append(1 - w_on / w_off)
    say(f"{r:<6} {s_on * 1e3:11.1f} {s_off * 1e3:12.1f} {w_on * 1e3:11.1f} {w_off * 1e3:12.1f} {s_off / s_on:7.3f} "
        f"{l_on:8.4f} {l_off:8.4f}")
say(f"median step time: on {statistics.median(on_s) * 1e3:.1f} ms, off {statistics.median(off_s) * 1e3:.1f} ms; "
    f"ratio off/on: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}..{max(ratios):.3f}")
say(f"exposed wait removed by prefetch (1 - wait_on / wait_off): median {100 * statistics.median(hidden):.1f}%, "
    f"range {100 * min(hidden):.1f}%..{100 * max(hidden):.1f}%; rounds with step_on < step_off: "
    f"{sum(r > 1 for r in ratios)} of {rounds}")
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
EOF
