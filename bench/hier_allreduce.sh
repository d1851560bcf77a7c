#!/usr/bin/env bash
# Hierarchical all-reduce vs flat Gloo across hosts: 2 test hosts
# (scripts/testhosts: network namespaces, a veth each on one bridge) x 2
# ranks, `dtrain launch` on each host running `dtrain-worker bench-comm --op
# all_reduce` (nccl-tests style: median of ITERS, every rank checks its
# result). Variants (VARIANTS, any of):
#   hier  --hier true: shared memory inside a host, Gloo between the two host
#         leaders, on a private tensor (staged into the host's segment);
#   reg   --hier true --registered true: the same on a range of the group's
#         symmetric buffer, as DDP's buckets (nccl-tests' -R): both host
#         stages in place, nothing staged or copied out;
#   flat  --hier false: Gloo's all-reduce over all 4 ranks (the baseline).
# Rounds interleaved (the order rotates). Reports busbw per size and
# variant, and each variant's ratio of medians over rounds against flat.
# Needs root (namespaces).
#   [VARIANTS="hier reg flat"] [ROUNDS=3] [ITERS=5] [MIN=1M] [MAX=64M] bench/hier_allreduce.sh
#   -> bench/results/hier_allreduce.txt (OUT=...)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
VARIANTS="${VARIANTS:-hier reg flat}" ROUNDS="${ROUNDS:-3}" ITERS="${ITERS:-5}" MIN="${MIN:-1M}" MAX="${MAX:-64M}"
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

run() {  # $1 = round, $2 = variant: rank 0's table on stdout
  local name="r$1_$2" pids=() i hier=true reg=false
  case "$2" in
    hier) ;;
    reg) reg=true ;;
    flat) hier=false ;;
    *) echo "hier_allreduce: VARIANTS has '$2': use hier, reg or flat" >&2; exit 2 ;;
  esac
  cat >"$tmp/$name.yaml" <<EOF
job: {name: hier-bench}
cluster: {nodes: 2, procs_per_node: 2, device: cpu, backend: gloo, rendezvous: {join_timeout_s: 60}}
parallel: {dp: 4}
log: {dir: $tmp/$name}
entrypoint: [$WORKER, bench-comm, --op, all_reduce, --min, $MIN, --max, $MAX, --iters, '$ITERS', --hier, '$hier', --registered, '$reg']
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
  [ "$hier" = true ] && want=shm+gloo
  grep -q "path $want)" "$tmp/${name}_node0.log" ||
    { cat "$tmp/${name}_node0.log" >&2; echo "hier_allreduce: $2 did not take path $want" >&2; exit 1; }
  if [ "$reg" = true ]; then
    grep -q "registered: the input is a range" "$tmp/${name}_node0.log" ||
      { cat "$tmp/${name}_node0.log" >&2; echo "hier_allreduce: $2 got no symmetric buffer" >&2; exit 1; }
  fi
  grep -E ' (ok|WRONG)$' "$tmp/${name}_node0.log" | sed 's/^.*\] *//'
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
read -r -a V <<<"$VARIANTS"
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((${#V[@]} - 1))); do  # the order rotates by one each round
    h="${V[$(((k + r - 1) % ${#V[@]}))]}"
    run "$r" "$h" | awk -v r="$r" -v h="$h" '{print r, h, $1, $4, $6, $7}' >>"$tmp/rows"
    echo "round $r $h done" >&2
  done
done
grep -q WRONG "$tmp/rows" && { cat "$tmp/rows" >&2; echo "hier_allreduce: a result was wrong" >&2; exit 1; }

{
  echo "# bench/hier_allreduce.sh: all_reduce fp32 on 2 test hosts x 2 ranks, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# command: VARIANTS=\"$VARIANTS\" ROUNDS=$ROUNDS ITERS=$ITERS MIN=$MIN MAX=$MAX bench/hier_allreduce.sh (commit $(git -C "$ROOT" rev-parse --short HEAD))"
  echo "# hier = shared memory inside a host + Gloo between the 2 host leaders, private tensors; reg = the same"
  echo "# on a range of the group's symmetric buffer (as DDP's buckets: in place); flat = Gloo over all 4 ranks"
  echo "# $(nproc --all) cores shared by both hosts (network namespaces of one kernel, veth + bridge)"
  echo "# median of $ITERS iters per size, $ROUNDS interleaved rounds; busbw = algbw x 2(n-1)/n (n = 4)"
  echo "# load average at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# rows: round, variant, size(B), time(us), busbw(GB/s), check"
  awk '{printf "%-3s %-6s %12s %12s %9s %s\n", $1, $2, $3, $4, $5, $6}' "$tmp/rows"
  python3 - "$tmp/rows" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
sizes = sorted({int(r[2]) for r in rows})
variants = list(dict.fromkeys(r[1] for r in rows))
others = [v for v in variants if v != "flat"]
print("## medians over rounds (busbw GB/s; ratio = variant / flat; won = rounds the variant beat flat)")
print(f"{'size(B)':>12s} " + " ".join(f"{v + '_busbw':>11s}" for v in variants) +
      ("".join(f" {v + '/flat':>9s} {'won':>5s}" for v in others) if "flat" in variants else ""))
for s in sizes:
    by = {v: {r[0]: float(r[4]) for r in rows if int(r[2]) == s and r[1] == v} for v in variants}
    med = {v: statistics.median(by[v].values()) for v in variants}
    line = f"{s:12d} " + " ".join(f"{med[v]:11.3f}" for v in variants)
    if "flat" in variants:
        for v in others:
            won = sum(by[v][k] > by["flat"][k] for k in by[v] if k in by["flat"])
            line += f" {med[v] / med['flat']:9.3f} {won:2d}/{len(by[v])}"
    print(line)
EOF
} | tee "$OUT"
