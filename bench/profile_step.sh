#!/usr/bin/env bash
# Where a training step's time goes, dtrain vs the Python DDP peer on the same
# PyTorch: perf samples (cpu-clock, every process of the run: the launcher,
# all ranks, the peer's torchrun) of the quickstart GPT at RANKS ranks,
# folded into categories by bench/profile_categories.py, one table per side;
# and dtrain's wall time by phase (forward, backward, gradient sync,
# optimizer, blocked in collectives) from its timeline trace of TRACE steps
# (bench/profile_phases.py). Sizes and KIND (gpt | llama; the peer is a GPT,
# so PEER=0 skips it) can be overridden; SETS adds dtrain --set overrides;
# PEER_SCRIPT picks the peer (gpt_ddp.py, the default; gpt_fsdp.py, FSDP2,
# beside SETS="parallel.zero=3").
#   [RANKS=2] [STEPS=150] [SECONDS_REC=8] [TAG=before] bench/profile_step.sh -> bench/results/profile_<TAG>.txt
#   the compute-bound size: D_MODEL=512 SEQ=128 MB=4 STEPS=60 bench/profile_step.sh
# Same sizes and flags as bench/peer_ratio.sh; OPENBLAS_CORETYPE, when set,
# is passed to both sides unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
RANKS="${RANKS:-2}"
STEPS="${STEPS:-150}"
TAG="${TAG:-now}"
OUT="${OUT:-$ROOT/bench/results/profile_$TAG.txt}"
VENV="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}"
PY="$VENV/bin/python"
cd "$ROOT"
command -v perf >/dev/null || { echo "profile_step: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
[ -x "$BUILD/apps/dtrain/dtrain-worker" ] || { echo "profile_step: build dtrain first" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-8}"
PEER_SCRIPT="${PEER_SCRIPT:-gpt_ddp.py}"
KIND="${KIND:-gpt}" PEER="${PEER:-1}" TRACE="${TRACE:-5}" LR=1e-3 WARMUP=20 BUCKET=1 EVERY=10
[ "$KIND" = gpt ] || PEER=0
EXTRA=()
PEER_EXTRA=()
[ "$PEER_SCRIPT" = gpt_ddp.py ] && PEER_EXTRA=(--bucket-mb "$BUCKET")  # FSDP2 has no buckets
for s in ${SETS:-}; do EXTRA+=(--set "$s"); done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-prof-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# Steady state only: perf attaches to the ranks (the launcher's / torchrun's
# children) once rank 0 has logged step 20, for SECONDS seconds.
profile() {  # $1 = side, $2 = pattern of the log line that marks step 20, then the command
  local side="$1" mark="$2"; shift 2
  "$@" >"$tmp/$side.log" 2>&1 &
  local top=$!
  for _ in $(seq 600); do
    grep -q "$mark" "$tmp/$side.log" && break
    kill -0 "$top" 2>/dev/null || break  # it ended (or failed) before the mark
    sleep 0.2
  done
  local pids; pids="$(pgrep -d, -P "$top" || true)"
  [ -n "$pids" ] || { cat "$tmp/$side.log" >&2; echo "profile_step: no ranks under pid $top" >&2; exit 1; }
  perf record -q -F 499 -e cpu-clock -p "$pids" -o "$tmp/$side.data" -- sleep "$SECONDS_REC" 2>/dev/null || true
  wait "$top" || { cat "$tmp/$side.log" >&2; echo "profile_step: $side failed" >&2; exit 1; }
}
SECONDS_REC="${SECONDS_REC:-8}"
profile dtrain "step 20/" \
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set train.steps="$STEPS" --set log.every="$EVERY" --set log.dir="$tmp/run" \
    --set checkpoint.dir='""' --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" \
    --set model.heads="$HEADS" --set model.seq_len="$SEQ" --set train.micro_batch="$MB" \
    --set parallel.dp="$RANKS" --set cluster.procs_per_node="$RANKS" --set train.lr="$LR" \
    --set train.warmup_steps="$WARMUP" --set parallel.ddp.bucket_mb="$BUCKET" --set model.kind="$KIND" \
    --set "log.trace.steps=[21, $((20 + TRACE))]" "${EXTRA[@]}"
[ "$PEER" = 1 ] && profile peer "peer step 20/" \
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$RANKS" \
    "bench/peer/$PEER_SCRIPT" --data data/corpus.txt \
    --layers "$LAYERS" --d-model "$D_MODEL" --heads "$HEADS" --seq-len "$SEQ" \
    --micro-batch "$MB" --steps "$STEPS" --lr "$LR" --warmup-steps "$WARMUP" \
    "${PEER_EXTRA[@]}" --log-every "$EVERY"
DT_MS="$("$PY" - "$tmp/run/metrics.jsonl" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(r for r in recs if r['step'] >= 20)
print(f"{(recs[-1]['elapsed_s'] - first['elapsed_s']) / (recs[-1]['step'] - first['step']) * 1e3:.2f}")
PYEOF
)"
PEER_MS=0
[ "$PEER" = 1 ] && PEER_MS="$(grep -o 'step_ms=[0-9.]*' "$tmp/peer.log" | tail -1 | cut -d= -f2)"
SIDES="dtrain"
[ "$PEER" = 1 ] && SIDES="dtrain peer"
for side in $SIDES; do
  perf report -q -i "$tmp/$side.data" --no-children --sort dso,sym -F overhead,sample,dso,sym --stdio 2>/dev/null >"$tmp/$side.txt"
done
{
  echo "# bench/profile_step.sh: perf cpu-clock samples of every process, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# $RANKS ranks on $(nproc --all) cores, $KIND $LAYERS x $D_MODEL, heads $HEADS, seq $SEQ, micro_batch $MB, $STEPS steps; load at end $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# dtrain --set overrides: ${SETS:-none}"
  echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, torch $("$PY" -c 'import torch; print(torch.__version__)') on both sides"
  echo "# samples: the ranks only, ${SECONDS_REC} s from rank 0's step 20 at 499 Hz; CPU ms = a rank's CPU time"
  echo "# per step in the category (samples / 499 Hz / ranks / steps in the window); wall ms = wall time per step"
  echo "# dtrain: $(grep -o 'step [0-9]*/[0-9]* .*tok/s' "$tmp/dtrain.log" | tail -1); $DT_MS ms/step"
  [ "$PEER" = 1 ] && echo "# peer:   $(grep -o 'PEER kind=[a-z0-9_]* tokens_per_s=[0-9.]*' "$tmp/peer.log" | tail -1); $PEER_MS ms/step"
  if [ "$PEER" = 1 ]; then
    "$PY" bench/profile_categories.py "$tmp/dtrain.txt" "$tmp/peer.txt" --step-ms "$DT_MS" "$PEER_MS" \
      --window-s "$SECONDS_REC" --ranks "$RANKS" --hz 499
  else
    "$PY" bench/profile_categories.py "$tmp/dtrain.txt" none --step-ms "$DT_MS" 0 \
      --window-s "$SECONDS_REC" --ranks "$RANKS" --hz 499
  fi
  echo "## dtrain: wall time by phase, steps 21..$((20 + TRACE)) (timeline trace)"
  "$PY" bench/profile_phases.py "$tmp/run/trace"
  for side in $SIDES; do
    echo "## $side: top 25 symbols (% of the ranks' samples)"
    sort -k2,2nr "$tmp/$side.txt" | head -25 | sed 's/^ */  /' || true  # head closes the pipe early
  done
} | tee "$OUT"
