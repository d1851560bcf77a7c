#!/usr/bin/env bash
# Do the steps' GEMMs run slower than the matmul rate MFU divides by? At the
# compute-bound size (bench/mfu.sh's), ROUNDS rounds of dtrain at 1 rank and at
# RANKS ranks, each rank's linear GEMMs timed in place by an LD_PRELOAD shim
# (bench/instep_gemm/shim.cpp) beside a 512^3 probe the shim runs on the same
# thread every 50 calls, against the worker's start-up probe (rank 0's log)
# and log.live_peak's figure. Prints per run: start-up rates, per rank the
# in-step rate and the probe beside it, and the run's mfu / mfu_live medians.
#   [ROUNDS=3] [RANKS=2] [STEPS=40] [DTRAIN_VENV=...] bench/instep_gemm.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
VENV="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}"
ROUNDS="${ROUNDS:-3}" RANKS="${RANKS:-2}" STEPS="${STEPS:-40}"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "instep_gemm: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
TORCH="$("$VENV/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
tmp="$(mktemp -d /tmp/dtrain-instep-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
g++ -std=c++20 -O2 -shared -fPIC -I"$TORCH/include" -o "$tmp/shim.so" bench/instep_gemm/shim.cpp \
  -L"$TORCH/lib" -ltorch_cpu -lc10
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
echo "# bench/instep_gemm.sh: ROUNDS=$ROUNDS RANKS=$RANKS STEPS=$STEPS, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  for r in 1 "$RANKS"; do
    d="$tmp/r${round}_n$r"
    LD_LIBRARY_PATH="$TORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_PRELOAD="$tmp/shim.so" \
      "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set cluster.shm=true \
      --set parallel.dp="$r" --set cluster.procs_per_node="$r" --set train.steps="$STEPS" --set log.every=10 \
      --set log.dir="$d" --set checkpoint.dir='""' --set model.layers=4 --set model.d_model=512 \
      --set model.heads=8 --set model.seq_len=128 --set train.micro_batch=4 --set train.lr=1e-3 \
      --set train.warmup_steps=20 --set parallel.ddp.bucket_mb=1 --set log.live_peak=true >"$d.log" 2>&1 ||
      { tail "$d.log" >&2; exit 1; }
    python3 - "$d" "$round" "$r" <<'PY'
import json, re, statistics, sys
d, rnd, ranks = sys.argv[1:4]
log = open(d + ".log").read()
start = re.search(r"matmul ([0-9.]+) GFLOP/s fp32 per rank", open(d + "/rank_0.log").read())
spread = re.search(r"the ranks' matmul rates: (min .*? GFLOP/s)", open(d + "/rank_0.log").read())
recs = [r for r in (json.loads(l) for l in open(d + "/metrics.jsonl") if l.strip()) if r.get("step", 0) >= 20 and "mfu" in r]
print("round %s, %s rank(s): start-up probe rank 0 %s GFLOP/s%s; mfu median %.3f, mfu_live median %.3f" % (
    rnd, ranks, start.group(1) if start else "?", " (rates " + spread.group(1) + ")" if spread else "",
    statistics.median(r["mfu"] for r in recs), statistics.median(r["mfu_live"] for r in recs)))
for m in re.finditer(r"(\[rank \d+\]) INSTEP_GEMM pid \d+: in-step ([0-9.]+) GFLOP/s over (\d+) calls, probe beside them ([0-9.]+)", log):
    print("    %s in-step %s GFLOP/s (%s calls), probe beside them %s: ratio %.3f" % (
        m.group(1), m.group(2), m.group(3), m.group(4), float(m.group(2)) / float(m.group(4))))
PY
  done
done
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
