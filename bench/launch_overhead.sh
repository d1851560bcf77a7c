#!/usr/bin/env bash
# Launch overhead: wall time from start to exit of 8 workers that run
# /bin/true, `dtrain launch` vs torchrun (the venv's PyTorch, DTRAIN_VENV) at
# its fastest settings: --monitor-interval 0.1 (2.15's default, given
# explicitly: 1.x polled every 5 s, which would flatter us) and no
# --redirects/--tee (no per-worker log files, no tail threads). Runs are
# interleaved; prints each median and the ratio (goal: dtrain <= 0.3x).
# Usage: bench/launch_overhead.sh [RUNS]   (DTRAIN_BUILD_DIR, default build/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
DTRAIN="$BUILD/apps/dtrain/dtrain"
RUNS="${1:-10}"
VENV="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}"
PY="$VENV/bin/python"
[ -x "$DTRAIN" ] || { echo "no $DTRAIN: build first (scripts/build)" >&2; exit 2; }
"$PY" -c 'import torch.distributed.run' 2>/dev/null ||
  { echo "$PY cannot import torch.distributed.run (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }

WORK="$(mktemp -d /tmp/dtrain-bench-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/spec.yaml" <<YAML
job: {name: launch-overhead}
cluster: {nodes: 1, procs_per_node: 8}
parallel: {dp: 8}
log: {dir: $WORK/run}
entrypoint: [/bin/true]
YAML

now() { date +%s.%N; }
# Runs "$@" quietly; prints its wall time in seconds; fails loudly on a non-zero exit.
timed() {
  local t0 t1 rc=0
  t0=$(now)
  "$@" > "$WORK/last.out" 2>&1 || rc=$?
  t1=$(now)
  if [ "$rc" -ne 0 ]; then
    echo "FAILED (exit $rc): $*" >&2
    tail -20 "$WORK/last.out" >&2
    exit 1
  fi
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f\n", b - a}'
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# One warm-up each (page cache, Python bytecode), not counted.
timed "$DTRAIN" launch "$WORK/spec.yaml" > /dev/null
timed "$PY" -m torch.distributed.run --standalone --nproc-per-node 8 --monitor-interval 0.1 \
  --no-python true > /dev/null

: > "$WORK/dtrain.txt"
: > "$WORK/torchrun.txt"
for i in $(seq "$RUNS"); do
  timed "$DTRAIN" launch "$WORK/spec.yaml" >> "$WORK/dtrain.txt"
  timed "$PY" -m torch.distributed.run --standalone --nproc-per-node 8 --monitor-interval 0.1 \
    --no-python true >> "$WORK/torchrun.txt"
  printf '.' >&2
done
echo >&2

d=$(median < "$WORK/dtrain.txt")
t=$(median < "$WORK/torchrun.txt")
ratio=$(awk -v d="$d" -v t="$t" 'BEGIN {printf "%.6f", d / t}')
printf 'launch overhead, 8 workers running /bin/true, %d interleaved runs each\n' "$RUNS"
printf '  dtrain launch : median %.3f s  (min %.3f, max %.3f)\n' "$d" \
  "$(sort -g "$WORK/dtrain.txt" | head -1)" "$(sort -g "$WORK/dtrain.txt" | tail -1)"
printf '  torchrun      : median %.3f s  (min %.3f, max %.3f)\n' "$t" \
  "$(sort -g "$WORK/torchrun.txt" | head -1)" "$(sort -g "$WORK/torchrun.txt" | tail -1)"
printf '  ratio         : %.2fx torchrun (goal <= 0.30x)\n' "$ratio"
printf '{"bench":"launch_overhead","workers":8,"runs":%d,"dtrain_s":%.4f,"torchrun_s":%.4f,"ratio":%.4f}\n' \
  "$RUNS" "$d" "$t" "$ratio"
