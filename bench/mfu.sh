#!/usr/bin/env bash
# MFU at the compute-bound size (GPT d_model 512, 4 layers, 8 heads, seq 128,
# micro_batch 4; bench/peer_ratio.sh's SIZE=compute) for DDP and ZeRO-3 at
# RANKS ranks, one thread per rank, REPS runs each. Prints, per run, the median
# of metrics.jsonl's `mfu` over the logged steps from step 20 on, the ranks'
# measured matmul peak (`peak_flops`, measured by each worker at start-up) and
# the achieved FLOP/s (mfu x peak), which does not depend on that measurement,
# and the spread of the ranks' rates (rank 0's start-up line): on a shared
# machine one core can run well below the other, and a synchronous step goes
# at the slower one's pace. bench/mfu_ceiling.py gives the MFU of a step that
# ran its GEMMs only, against the same peak. The runs set log.live_peak, so
# each record also has mfu_live: the same interval against the ranks' rate
# measured beside its steps (a probe matmul after each; the start-up figure
# alone moves with the host's speed at start-up; bench/instep_gemm.sh
# compares the steps' GEMMs with a probe taken beside them).
#   [RANKS=2] [REPS=4] [STEPS=60] [DTRAIN_BUILD_DIR=build] bench/mfu.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
RANKS="${RANKS:-2}" REPS="${REPS:-4}" STEPS="${STEPS:-60}"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "mfu: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-mfu-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
echo "# bench/mfu.sh: RANKS=$RANKS REPS=$REPS STEPS=$STEPS, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq "$REPS"); do
  for z in 0 3; do
    d="$tmp/z${z}_$rep"
    "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set cluster.shm=true \
      --set parallel.dp="$RANKS" --set parallel.zero="$z" --set cluster.procs_per_node="$RANKS" \
      --set train.steps="$STEPS" --set log.every=10 --set log.dir="$d" --set checkpoint.dir='""' \
      --set model.layers=4 --set model.d_model=512 --set model.heads=8 --set model.seq_len=128 \
      --set train.micro_batch=4 --set train.lr=1e-3 --set train.warmup_steps=20 \
      --set parallel.ddp.bucket_mb=1 --set log.live_peak=true >"$d.log" 2>&1 || { tail "$d.log" >&2; exit 1; }
    python3 - "$d/metrics.jsonl" "$z" "$rep" "$d/rank_0.log" <<'PY'
import json, re, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
spread = re.search(r"the ranks' matmul rates: (min .*? GFLOP/s)", open(sys.argv[4]).read())
recs = [r for r in recs if r.get("step", 0) >= 20 and r.get("mfu")]
m = statistics.median(r["mfu"] for r in recs)
live = statistics.median(r["mfu_live"] for r in recs)
peak = recs[-1]["peak_flops"]
# The run's own figure against the live peak: every record's interval
# weighs the same (10 steps), so the mean achieved rate over the mean live
# peak.
achieved = statistics.mean(r["flops_per_step"] / r["step_time_s"] for r in recs)
run_live = achieved / statistics.mean(r["peak_flops_live"] for r in recs)
print("zero %s run %s: mfu median %.3f over %d records (%s), peak_flops %.3g, achieved %.3g FLOP/s; ranks' rates %s; "
      "mfu_live median %.3f (%s), peak_flops_live %s; run mfu_live %.3f" % (
    sys.argv[2], sys.argv[3], m, len(recs), " ".join("%.3f" % r["mfu"] for r in recs), peak, m * peak,
    spread.group(1) if spread else "?", live, " ".join("%.3f" % r["mfu_live"] for r in recs),
    " ".join("%.3g" % r["peak_flops_live"] for r in recs), run_live))
PY
  done
done
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
