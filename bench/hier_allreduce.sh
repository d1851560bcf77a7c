#!/usr/bin/env bash
# Hierarchical all-reduce vs flat Gloo across hosts: 2 test hosts
# (scripts/testhosts: network namespaces, a veth each on one bridge) x 2
# ranks, `dtrain launch` on each host running `dtrain-worker bench-comm --op
# all_reduce` (nccl-tests style: median of ITERS, every rank checks its
# result) with --hier true (shared memory inside a host, Gloo between the two
# host leaders) and --hier false (Gloo's all-reduce over all 4 ranks), rounds
# interleaved (the order alternates). Reports busbw per size and variant,
# and the ratio of the medians over rounds. Needs root (namespaces).
#   [ROUNDS=3] [ITERS=5] [MIN=1M] [MAX=64M] bench/hier_allreduce.sh  -> bench/results/hier_allreduce.txt (OUT=...)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
ROUNDS="${ROUNDS:-3}" ITERS="${ITERS:-5}" MIN="${MIN:-1M}" MAX="${MAX:-64M}"
OUT="${OUT:-$ROOT/bench/results/hier_allreduce.txt}"
DTRAIN="$BUILD/apps/dtrain/dtrain" WORKER="$BUILD/apps/dtrain/dtrain-worker"
[ -x "$DTRAIN" ] && [ -x "$WORKER" ] || { echo "hier_allreduce: build dtrain first (scripts/build)" >&2; exit 2; }
"$ROOT/scripts/testhosts" check >/dev/null || { "$ROOT/scripts/testhosts" check >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 DTRAIN_TOKEN=hier-bench

# The test hosts are one machine-wide set: wait for any test's or bench's
# hosts to go down first (the lock TestHosts holds, tests/support/test_hosts.h).
exec 9>/run/dtrain-testhosts-test.lock
flock 9
tmp="$(mktemp -d /tmp/dtrain-hier-XXXXXX)"
cleanup() { "$ROOT/scripts/testhosts" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$ROOT/scripts/testhosts" up 2 >/dev/null
RDZV="$("$ROOT/scripts/testhosts" addr 0):29400"

run() {  # $1 = round, $2 = true|false (--hier): rank 0's table on stdout
  local name="r$1_$2" pids=() i
  cat >"$tmp/$name.yaml" <<EOF
job: {name: hier-bench}
cluster: {nodes: 2, procs_per_node: 2, device: cpu, backend: gloo, rendezvous: {join_timeout_s: 60}}
parallel: {dp: 4}
log: {dir: $tmp/$name}
entrypoint: [$WORKER, bench-comm, --op, all_reduce, --min, $MIN, --max, $MAX, --iters, '$ITERS', --hier, '$2']
EOF
  for i in 0 1; do
    "$ROOT/scripts/testhosts" exec "$i" "$DTRAIN" launch "$tmp/$name.yaml" --node-rank "$i" \
      --rdzv "$RDZV" >"$tmp/${name}_node$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do
    wait "${pids[$i]}" || { cat "$tmp/${name}_node$i.log" >&2; echo "hier_allreduce: node $i failed" >&2; exit 1; }
  done
  local want=gloo
  [ "$2" = true ] && want=shm+gloo
  grep -q "path $want)" "$tmp/${name}_node0.log" ||
    { cat "$tmp/${name}_node0.log" >&2; echo "hier_allreduce: --hier $2 did not take path $want" >&2; exit 1; }
  grep -E ' (ok|WRONG)$' "$tmp/${name}_node0.log" | sed 's/^.*\] *//'
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="true false"; else order="false true"; fi
  for h in $order; do
    run "$r" "$h" | awk -v r="$r" -v h="$h" '{print r, h, $1, $4, $6, $7}' >>"$tmp/rows"
    echo "round $r --hier $h done" >&2
  done
done
grep -q WRONG "$tmp/rows" && { cat "$tmp/rows" >&2; echo "hier_allreduce: a result was wrong" >&2; exit 1; }

{
  echo "# bench/hier_allreduce.sh: all_reduce fp32 on 2 test hosts x 2 ranks, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# command: ROUNDS=$ROUNDS ITERS=$ITERS MIN=$MIN MAX=$MAX bench/hier_allreduce.sh (commit $(git -C "$ROOT" rev-parse --short HEAD))"
  echo "# hier = shared memory inside a host + Gloo between the 2 host leaders; flat = Gloo over all 4 ranks"
  echo "# $(nproc --all) cores shared by both hosts (network namespaces of one kernel, veth + bridge)"
  echo "# median of $ITERS iters per size, $ROUNDS interleaved rounds; busbw = algbw x 2(n-1)/n (n = 4)"
  echo "# load average at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# rows: round, variant, size(B), time(us), busbw(GB/s), check"
  awk '{printf "%-3s %-6s %12s %12s %9s %s\n", $1, ($2 == "true" ? "hier" : "flat"), $3, $4, $5, $6}' "$tmp/rows"
  python3 - "$tmp/rows" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
sizes = sorted({int(r[2]) for r in rows})
print(f"## medians over rounds\n{'size(B)':>12s} {'hier_busbw':>11s} {'flat_busbw':>11s} {'hier/flat':>9s} {'rounds_won':>10s}")
for s in sizes:
    h = {r[0]: float(r[4]) for r in rows if int(r[2]) == s and r[1] == "true"}
    f = {r[0]: float(r[4]) for r in rows if int(r[2]) == s and r[1] == "false"}
    mh, mf = statistics.median(h.values()), statistics.median(f.values())
    won = sum(h[k] > f[k] for k in h if k in f)
    print(f"{s:12d} {mh:11.3f} {mf:11.3f} {mh / mf:9.3f} {won:6d}/{len(h)}")
EOF
} | tee "$OUT"
