#!/usr/bin/env bash
# dtrain's pipeline schedules against torch.distributed.pipelining's on the
# same PyTorch: pp PP ranks (one thread each), M micro-batches per step,
# 1F1B (Schedule1F1B) and interleaved 1F1B with 2 virtual stages per rank
# (ScheduleInterleaved1F1B), bench/peer/gpt_pp.py as the peer; quickstart
# GPT sizes. Interleaved rounds (dtrain first in odd rounds, the peer in
# even ones). Per run: tokens/s from the end of step EVERY to the last step
# and rank 0's process CPU ms per step over the same steps (dtrain:
# metrics.jsonl's cpu_s; the peer: its rank0_cpu_ms_per_step), and every
# rank's from step 20 to STEPS - 10 (bench/pp_rank_cpu.py): on a loaded
# machine CPU time moves far less than wall time. Per schedule the per-round
# ratios dtrain / peer (tokens/s; CPU: peer / dtrain) and their medians.
#   [ROUNDS=3] [STEPS=60] [PP=2] [M=4] [SCHEDS="1f1b interleaved"] bench/pp_peer_ratio.sh
#     -> bench/results/pp_peer_ratio.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
ROUNDS="${ROUNDS:-3}" STEPS="${STEPS:-60}" PP="${PP:-2}" M="${M:-4}" SCHEDS="${SCHEDS:-1f1b interleaved}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-8}" EVERY=10
OUT="${OUT:-$ROOT/bench/results/pp_peer_ratio.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "pp_peer_ratio: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-pp-peer-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# every rank's CPU ms per step from step 20 to STEPS - 10, read from /proc
# while the job runs (bench/pp_rank_cpu.py): $1 = the job's pid, $2 = the
# file it logs steps to, $3 = the step's regex
rank_cpu() { "$PY" "$ROOT/bench/pp_rank_cpu.py" "$1" "$2" "$3" 20 $((STEPS - 10)); }

dtrain_run() {  # $1 = name, $2 = schedule; prints "tokens/s loss cpu_ms_per_step cpu_per_rank"
  local dir="$tmp/$1" sched=1f1b v=1
  [ "$2" = interleaved ] && sched=interleaved_1f1b v=2
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set parallel.pp="$PP" --set parallel.dp=1 \
    --set cluster.procs_per_node="$PP" --set parallel.pipeline.schedule="$sched" \
    --set parallel.pipeline.virtual_stages="$v" --set train.grad_accum="$M" --set train.steps="$STEPS" \
    --set log.every="$EVERY" --set log.dir="$dir" --set checkpoint.dir='""' --set model.layers="$LAYERS" \
    --set model.d_model="$D_MODEL" --set model.heads="$HEADS" --set model.seq_len="$SEQ" \
    --set train.micro_batch="$MB" --set train.lr=1e-3 --set train.warmup_steps=20 ${DTRAIN_SETS:-} \
    >"$dir.log" 2>&1 &
  local pid=$! ranks
  ranks="$(rank_cpu "$pid" "$dir/metrics.jsonl" '"step": (\d+)')"
  wait "$pid" || { cat "$dir.log" >&2; echo "pp_peer_ratio: dtrain $1 failed" >&2; exit 1; }
  "$PY" - "$dir/metrics.jsonl" "$((MB * M * SEQ))" "$EVERY" "$ranks" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
recs = [r for r in recs if 'elapsed_s' in r]
first = next(r for r in recs if r['step'] >= int(sys.argv[3]))
last = recs[-1]
steps = last['step'] - first['step']
print(f"{steps * int(sys.argv[2]) / (last['elapsed_s'] - first['elapsed_s']):.1f} {last['loss']:.6f} "
      f"{1e3 * (last['cpu_s'] - first['cpu_s']) / steps:.2f} {sys.argv[4]}")
PYEOF
}

peer_run() {  # $1 = name, $2 = schedule; prints "tokens/s loss cpu_ms_per_step cpu_per_rank"
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$PP" bench/peer/gpt_pp.py --data data/corpus.txt \
    --layers "$LAYERS" --d-model "$D_MODEL" --heads "$HEADS" --seq-len "$SEQ" --micro-batch "$MB" \
    --grad-accum "$M" --steps "$STEPS" --lr 1e-3 --warmup-steps 20 --log-every "$EVERY" --schedule "$2" \
    >"$tmp/$1.log" 2>&1 &
  local pid=$! ranks
  ranks="$(rank_cpu "$pid" "$tmp/$1.log" 'peer step (\d+)/')"
  wait "$pid" || { tail -20 "$tmp/$1.log" >&2; echo "pp_peer_ratio: peer $1 failed" >&2; exit 1; }
  echo "$(grep 'PEER kind=' "$tmp/$1.log" | tail -1 |
    sed -E 's/.*tokens_per_s=([0-9.]+).*final_loss=([0-9.]+).*rank0_cpu_ms_per_step=([0-9.]+).*/\1 \2 \3/') $ranks"
}

{
  echo "# bench/pp_peer_ratio.sh: dtrain ($BUILD, worktree at $(git rev-parse --short HEAD)) vs torch.distributed.pipelining, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# pp $PP (one thread per rank) on $(nproc --all) cores, $M micro-batches of $MB x $SEQ, GPT $LAYERS x $D_MODEL;"
  echo "# $STEPS steps, tokens/s from step $EVERY; load before: $(cut -d' ' -f1-3 /proc/loadavg)${DTRAIN_SETS:+; dtrain $DTRAIN_SETS}"
  echo "| schedule | round | dtrain tok/s | peer tok/s | dtrain / peer | dtrain CPU ms/step | peer CPU ms/step | peer / dtrain CPU | dtrain loss | peer loss | dtrain CPU ms/step per rank | peer CPU ms/step per rank | peer / dtrain CPU per rank |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} | tee "$OUT"
for k in $(seq "$ROUNDS"); do
  for s in $SCHEDS; do
    if [ $((k % 2)) -eq 1 ]; then d="$(dtrain_run "d_${s}_$k" "$s")"; p="$(peer_run "p_${s}_$k" "$s")"
    else p="$(peer_run "p_${s}_$k" "$s")"; d="$(dtrain_run "d_${s}_$k" "$s")"; fi
    read -r dt dl dc dr <<<"$d"; read -r pt pl pc pr <<<"$p"
    per="$("$PY" -c "import sys; d, p = sys.argv[1:]; print('na' if 'na' in (d, p) else '/'.join(f'{float(b) / float(a):.3f}' for a, b in zip(d.split('/'), p.split('/'))))" "$dr" "$pr")"
    echo "| $s | $k | $dt | $pt | $("$PY" -c "print(f'{$dt / $pt:.3f}')") | $dc | $pc | $("$PY" -c "print(f'{$pc / $dc:.3f}')") | $dl | $pl | $dr | $pr | $per |" | tee -a "$OUT"
  done
done
for s in $SCHEDS; do
  "$PY" - "$OUT" "$s" <<'PYEOF' | tee -a "$OUT"
import statistics, sys
rows = [l.split('|') for l in open(sys.argv[1]) if l.startswith(f"| {sys.argv[2]} |")]
per = [[float(x) for x in r[13].split("/")] for r in rows if r[13].strip() != "na"]
per = "/".join(f"{statistics.median(p[i] for p in per):.3f}" for i in range(len(per[0]))) if per else "na"
print(f"# {sys.argv[2]}: median dtrain / peer {statistics.median(float(r[5]) for r in rows):.3f} (tokens/s), "
      f"{statistics.median(float(r[8]) for r in rows):.3f} (peer / dtrain CPU per step, rank 0), "
      f"{per} (the same per rank) over {len(rows)} rounds")
PYEOF
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); reproduce: ROUNDS=$ROUNDS STEPS=$STEPS PP=$PP M=$M SCHEDS=\"$SCHEDS\" bench/pp_peer_ratio.sh" | tee -a "$OUT"
