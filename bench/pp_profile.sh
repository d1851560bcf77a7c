#!/usr/bin/env bash
# Where a pipeline step's time goes, dtrain vs torch.distributed.pipelining
# (bench/peer/gpt_pp.py) on the same PyTorch, for each of SCHEDS (1f1b;
# interleaved = v 2): perf cpu-clock samples of the ranks folded into
# categories (bench/profile_categories.py; CPU ms per step per rank), and
# dtrain's timeline trace of TRACE steps per rank: wall ms per step and count
# of each pipeline action (forward / backward per chunk, time blocked in
# receives, send posting; collectives: the time blocked in them), the
# messages per step and their bytes.
# Sizes as bench/pp_peer_ratio.sh (quickstart GPT, pp 2, 4 micro-batches).
#   [PP=2] [M=4] [SCHEDS="1f1b interleaved"] [STEPS=60] [SECONDS_REC=6] bench/pp_profile.sh
#     -> bench/results/pp_interleaved_profile.txt (OUT=...)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
PP="${PP:-2}" M="${M:-4}" SCHEDS="${SCHEDS:-1f1b interleaved}" STEPS="${STEPS:-60}" TRACE="${TRACE:-10}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-8}" EVERY=10
SECONDS_REC="${SECONDS_REC:-6}"
OUT="${OUT:-$ROOT/bench/results/pp_interleaved_profile.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
command -v perf >/dev/null || { echo "pp_profile: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
[ -x "$BUILD/apps/dtrain/dtrain-worker" ] || { echo "pp_profile: build dtrain first" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-pp-prof-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# perf attaches to the ranks (children of the launcher / torchrun) once rank 0
# has logged step 20, for SECONDS_REC seconds.
profile() {  # $1 = name, $2 = pattern marking step 20, then the command
  local name="$1" mark="$2"; shift 2
  "$@" >"$tmp/$name.log" 2>&1 &
  local top=$!
  for _ in $(seq 900); do grep -q "$mark" "$tmp/$name.log" && break; sleep 0.2; done
  local pids; pids="$(pgrep -d, -P "$top")"
  [ -n "$pids" ] || { cat "$tmp/$name.log" >&2; echo "pp_profile: no ranks under pid $top" >&2; exit 1; }
  perf record -q -F 499 -e cpu-clock -p "$pids" -o "$tmp/$name.data" -- sleep "$SECONDS_REC" 2>/dev/null || true
  wait "$top" || { cat "$tmp/$name.log" >&2; echo "pp_profile: $name failed" >&2; exit 1; }
  perf report -q -i "$tmp/$name.data" --no-children --sort dso,sym -F overhead,sample,dso,sym --stdio \
    2>/dev/null >"$tmp/$name.txt"
}

{
  echo "# bench/pp_profile.sh: pipeline step profile, dtrain ($BUILD at $(git rev-parse --short HEAD)) vs gpt_pp.py, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# pp $PP on $(nproc --all) cores (1 thread per rank), $M micro-batches of $MB x $SEQ, GPT $LAYERS x $D_MODEL, $STEPS steps"
  echo "# perf: the ranks, ${SECONDS_REC} s from rank 0's step 20 at 499 Hz; timeline: steps 21..$((20 + TRACE)); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
for s in $SCHEDS; do
  sched=1f1b v=1
  [ "$s" = interleaved ] && sched=interleaved_1f1b v=2
  profile "d_$s" "step 20/" "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set parallel.pp="$PP" \
    --set parallel.dp=1 --set cluster.procs_per_node="$PP" --set parallel.pipeline.schedule="$sched" \
    --set parallel.pipeline.virtual_stages="$v" --set train.grad_accum="$M" --set train.steps="$STEPS" \
    --set log.every="$EVERY" --set log.dir="$tmp/run_$s" --set checkpoint.dir='""' --set model.layers="$LAYERS" \
    --set model.d_model="$D_MODEL" --set model.heads="$HEADS" --set model.seq_len="$SEQ" \
    --set train.micro_batch="$MB" --set train.lr=1e-3 --set train.warmup_steps=20 \
    --set "log.trace.steps=[21, $((20 + TRACE))]"
  profile "p_$s" "peer step 20/" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$PP" \
    bench/peer/gpt_pp.py --data data/corpus.txt --layers "$LAYERS" --d-model "$D_MODEL" --heads "$HEADS" \
    --seq-len "$SEQ" --micro-batch "$MB" --grad-accum "$M" --steps "$STEPS" --lr 1e-3 --warmup-steps 20 \
    --log-every "$EVERY" --schedule "$s"
  DT_MS="$("$PY" - "$tmp/run_$s/metrics.jsonl" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and 'elapsed_s' in l]
first = next(r for r in recs if r['step'] >= 20)
print(f"{(recs[-1]['elapsed_s'] - first['elapsed_s']) / (recs[-1]['step'] - first['step']) * 1e3:.2f}")
PYEOF
)"
  PEER_MS="$(grep -o 'step_ms=[0-9.]*' "$tmp/p_$s.log" | tail -1 | cut -d= -f2)"
  {
    echo
    echo "## $s: perf categories, dtrain ($DT_MS ms/step) vs peer ($PEER_MS ms/step)"
    "$PY" bench/profile_categories.py "$tmp/d_$s.txt" "$tmp/p_$s.txt" --step-ms "$DT_MS" "$PEER_MS" \
      --window-s "$SECONDS_REC" --ranks "$PP" --hz 499
    echo "## $s: dtrain timeline, wall ms per step by action (count per step), per rank"
    "$PY" - "$tmp/run_$s/trace" <<'PYEOF'
import collections, glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/rank_*.json")):
    j = json.load(open(f))
    steps = j["steps"][1] - j["steps"][0] + 1
    ms, n, nbytes = collections.Counter(), collections.Counter(), 0
    for kind, b, e, wait, nb, step, micro, chunk, op, group in j["spans"]:
        key = f"{kind} {op}".strip()
        # a collective's span runs from its post to its completion; what
        # the rank lost is the time blocked in the call or its wait()
        ms[key] += (wait if kind == "collective" else e - b) / 1e6
        n[key] += 1
        if kind.startswith("send"):
            nbytes += nb
    order = sorted(ms, key=lambda k: -ms[k])
    print(f"  {f.split('/')[-1][:-5]}: " + ", ".join(f"{k} {ms[k] / steps:.2f} ({n[k] / steps:g})" for k in order))
    sends = sum(n[k] for k in n if k.startswith("send")) / steps
    print(f"    messages sent per step {sends:g}, {nbytes / steps / 1024:.0f} KiB")
PYEOF
    for side in d p; do
      echo "## $s: $([ $side = d ] && echo dtrain || echo peer): top 15 symbols (% of the ranks' samples)"
      sort -k2,2nr "$tmp/${side}_$s.txt" | head -15 | sed 's/^ */  /' || true
    done
  } | tee -a "$OUT"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); reproduce: PP=$PP M=$M STEPS=$STEPS bench/pp_profile.sh" | tee -a "$OUT"
