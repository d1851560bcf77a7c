#!/usr/bin/env bash
# DDP overlap on vs off at 4 CPU ranks (the quickstart spec, interleaved
# rounds). Overlap off all-reduces every bucket after backward, so its time in
# Ddp::finish_gradient_sync is the whole all-reduce time; with overlap on that
# wait is only the part not hidden behind backward.
#   hidden = 1 - wait(on) / wait(off);  step ratio = step(off) / step(on)
#   [ROUNDS=3] [STEPS=60] [BUCKET_MB=1] bench/ddp_overlap.sh  -> bench/results/ddp_overlap.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-60}"
BUCKET_MB="${BUCKET_MB:-1}"
OUT="${OUT:-$ROOT/bench/results/ddp_overlap.txt}"
# Only the summary below needs a Python; use the venv's, as the other benches do.
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain-worker" ] || { echo "ddp_overlap: build dtrain first" >&2; exit 2; }
[ -x "$PY" ] || { echo "ddp_overlap: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus

tmp="$(mktemp -d /tmp/dtrain-overlap-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = on|off, $2 = round
  local dir="$tmp/$1$2"
  local flag=true
  [ "$1" = off ] && flag=false
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set train.steps="$STEPS" \
    --set log.every=10 --set log.dir="$dir" --set checkpoint.dir='""' \
    --set parallel.ddp.overlap="$flag" --set parallel.ddp.bucket_mb="$BUCKET_MB" \
    >"$tmp/$1$2.log" 2>&1 || { cat "$tmp/$1$2.log" >&2; exit 1; }
}

for r in $(seq "$ROUNDS"); do
  run on "$r"
  run off "$r"
  echo "round $r done" >&2
done

"$PY" - "$tmp" "$ROUNDS" "$STEPS" "$BUCKET_MB" <<'EOF' | tee "$OUT"
import json, os, statistics, sys, time
tmp, rounds, steps, bucket = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def stats(path):
    """Step time and exposed-comm wait per step, averaged after step 10."""
    recs = [json.loads(l) for l in open(os.path.join(path, "metrics.jsonl")) if l.strip()]
    prev, tot, step_s, wait_s, in_bwd = None, 0, 0.0, 0.0, []
    for r in recs:
        if prev is not None and prev >= 10:
            n = r["step"] - prev
            tot += n
            step_s += n * r["step_time_s"]
            wait_s += n * r["sync_wait_s"]
            in_bwd.append(r.get("buckets_in_backward", 0))
        prev = r["step"]
    return step_s / tot, wait_s / tot, max(in_bwd)

print(f"# bench/ddp_overlap.sh: DDP overlap on vs off, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
print(f"# configs/quickstart.yaml (4 ranks, dp 4, gloo) on {os.cpu_count()} cores, {steps} steps, "
      f"bucket_mb {bucket}; averages after step 10; rounds interleaved")
print(f"{'round':6} {'step_on_ms':>11} {'step_off_ms':>12} {'wait_on_ms':>11} {'wait_off_ms':>12} "
      f"{'step_ratio':>11} {'hidden':>7} {'buckets_in_bwd':>15}")
ratios, hidden, on_all, off_all = [], [], [], []
for r in range(1, rounds + 1):
    s_on, w_on, b_on = stats(os.path.join(tmp, f"on{r}"))
    s_off, w_off, _ = stats(os.path.join(tmp, f"off{r}"))
    ratios.append(s_off / s_on)
    hidden.append(1 - w_on / w_off)
    print(f"{r:<6} {s_on * 1e3:11.1f} {s_off * 1e3:12.1f} {w_on * 1e3:11.1f} {w_off * 1e3:12.1f} "
          f"{s_off / s_on:11.3f} {100 * (1 - w_on / w_off):6.1f}% {b_on:15}")
print(f"median: step time off/on {statistics.median(ratios):.3f}x, "
      f"all-reduce time hidden behind backward {100 * statistics.median(hidden):.1f}%")
EOF
