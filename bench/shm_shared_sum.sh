#!/usr/bin/env bash
# The symmetric all-reduce's shared sum (engine/comm/shm_symmetric.cpp) A/B
# against the last-arriver protocol (DTRAIN_SHARED_SHM_SUM=0, where the last
# member to arrive sums the whole range alone), on one build: `dtrain launch`
# of N local workers running `dtrain-worker bench-comm --op all_reduce
# --registered true` (each size a range of the group's symmetric buffer, as
# DDP's buckets; nccl-tests' busbw), both sides per round, interleaved
# (shared first in odd rounds, last-arriver first in even ones). Prints each
# run's busbw per size and, per size, the median over rounds of shared /
# last-arriver busbw.
#   [RANKS="2 4"] [ROUNDS=3] [MIN=1M] [MAX=64M] [ITERS=9] bench/shm_shared_sum.sh -> stdout
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
RANKS="${RANKS:-2 4}" ROUNDS="${ROUNDS:-3}" MIN="${MIN:-1M}" MAX="${MAX:-64M}" ITERS="${ITERS:-9}"
DTRAIN="$BUILD/apps/dtrain/dtrain" WORKER="$BUILD/apps/dtrain/dtrain-worker"
[ -x "$DTRAIN" ] && [ -x "$WORKER" ] || { echo "shm_shared_sum: build dtrain first (scripts/build)" >&2; exit 2; }
tmp="$(mktemp -d /tmp/dtrain-shared-sum-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
echo "# bench/shm_shared_sum.sh: RANKS=\"$RANKS\" ROUNDS=$ROUNDS MIN=$MIN MAX=$MAX ITERS=$ITERS, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); busbw in GB/s (nccl-tests' all_reduce factor 2(n-1)/n), median of $ITERS iters per size"
run() {  # $1 = ranks, $2 = 1 shared | 0 last-arriver, $3 = name: "size busbw" lines into $tmp/$3.txt
  cat >"$tmp/$3.yaml" <<YAML
job: {name: shared-sum-bench}
cluster: {nodes: 1, procs_per_node: $1, device: cpu, backend: gloo, shm: true}
parallel: {dp: $1}
log: {dir: $tmp/$3}
entrypoint: [$WORKER, bench-comm, --op, all_reduce, --min, $MIN, --max, $MAX, --iters, '$ITERS', --registered, 'true']
YAML
  DTRAIN_SHARED_SHM_SUM="$2" "$DTRAIN" launch "$tmp/$3.yaml" >"$tmp/$3.log" 2>&1 || { tail "$tmp/$3.log" >&2; exit 1; }
  grep -q "registered: the input is a range" "$tmp/$3.log" || { echo "shm_shared_sum: no symmetric buffer" >&2; exit 1; }
  if grep -q WRONG "$tmp/$3.log"; then echo "shm_shared_sum: a wrong result" >&2; exit 1; fi
  grep -E "fp32 .* ok" "$tmp/$3.log" | awk '{print $3, $8}' >"$tmp/$3.txt"
  echo "$1 ranks, $( [ "$2" = 1 ] && echo "shared      " || echo "last-arriver"): $(awk '{printf "%s %s; ", $1, $2}' "$tmp/$3.txt")"
}
for n in $RANKS; do
  for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then run "$n" 1 "s_${n}_$round"; run "$n" 0 "l_${n}_$round"
    else run "$n" 0 "l_${n}_$round"; run "$n" 1 "s_${n}_$round"; fi
  done
  python3 - "$tmp" "$n" "$ROUNDS" <<'PY'
import statistics, sys
tmp, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(p): return {int(a): float(b) for a, b in (l.split() for l in open(p) if l.strip())}
ratios = {}
for r in range(1, rounds + 1):
    s, l = load(f"{tmp}/s_{n}_{r}.txt"), load(f"{tmp}/l_{n}_{r}.txt")
    for size in s:
        ratios.setdefault(size, []).append(s[size] / l[size])
print(f"{n} ranks: busbw shared / last-arriver, median over {rounds} rounds (min-max):")
for size in sorted(ratios):
    v = ratios[size]
    print(f"  {size:>10} B  {statistics.median(v):.2f}  ({min(v):.2f}-{max(v):.2f})")
PY
done
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
