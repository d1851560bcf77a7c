#!/usr/bin/env bash
# How long the step loop is stopped for an in-memory checkpoint copy
# (checkpoint.memory), made in the background (the default) vs on the
# training thread (DTRAIN_MEMORY_COPY_SYNC=1): 2 test hosts (scripts/testhosts,
# needs root), 1 CPU worker each, dp 2; the defaults give each rank about
# 128 MB of model + AdamW state. Per run, over the copy steps before the last
# (the first leaves out the node-layout gather): the median ckpt_block_ms,
# the median host-copy time (rank 0's "host copies taken in" line: one
# in-memory copy of the rank's state), the median of each step's ratio of
# the two (goal <= 1.2 in the background) and the median memory_copy_ms (the
# copy's whole time). Runs
# interleave (sync, async, ...) so load drifts hit both.
#   [LAYERS=6 D_MODEL=384 HEADS=6 STEPS=12 EVERY=2 REPS=1] bench/memory_copy_async.sh
#     -> bench/results/memory_copy_async.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
LAYERS="${LAYERS:-6}" D_MODEL="${D_MODEL:-384}" HEADS="${HEADS:-6}" STEPS="${STEPS:-12}" EVERY="${EVERY:-2}"
REPS="${REPS:-1}"
OUT="${OUT:-$ROOT/bench/results/memory_copy_async.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "memory_copy_async: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
scripts/testhosts check >/dev/null || { scripts/testhosts check; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
export DTRAIN_TOKEN=memory-copy-bench DTRAIN_NO_REBUILD=1
tmp="$(mktemp -d /tmp/dtrain-memory-copy-XXXXXX)"
exec 9>/run/dtrain-testhosts-test.lock
flock 9  # the tests' lock: one user of the test hosts at a time
scripts/testhosts up 2 >/dev/null
trap 'scripts/testhosts down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
RDZV="$(scripts/testhosts addr 0):29400"
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # run NAME SYNC
  local name="$1" sync="$2" pids=()
  for i in 0 1; do
    DTRAIN_MEMORY_COPY_SYNC="$sync" nsenter --net=/run/netns/dtrain-h$i -- "$BUILD/apps/dtrain/dtrain" launch \
      configs/quickstart.yaml --node-rank "$i" --rdzv "$RDZV" --set cluster.nodes=2 --set cluster.procs_per_node=1 \
      --set parallel.dp=2 --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
      --set train.steps="$STEPS" --set train.warmup_steps=1 --set log.every="$STEPS" \
      --set checkpoint.every="$STEPS" --set checkpoint.keep=1 --set checkpoint.memory.every="$EVERY" \
      --set log.dir="$tmp/$name" --set checkpoint.dir="$tmp/$name/ckpt" >"$tmp/$name.node$i.log" 2>&1 &
    pids+=($!)
    [ "$i" = 0 ] && sleep 2  # the rendezvous server first (node 0's agent)
  done
  for p in "${pids[@]}"; do
    wait "$p" || { cat "$tmp/$name.node0.log" >&2; echo "memory_copy_async: $name failed" >&2; exit 1; }
  done
  echo "$name done" >&2
}
for rep in $(seq 1 "$REPS"); do
  run "r$rep-sync" 1
  run "r$rep-async" 0
done
LOAD1="$(cut -d' ' -f1-3 /proc/loadavg)"
CMD="LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS STEPS=$STEPS EVERY=$EVERY REPS=$REPS bench/memory_copy_async.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$LOAD1" "$REPS" "$STEPS" <<'PYEOF'
import json, os, re, statistics, sys, time
tmp, out_path, cmd, load0, load1, reps, last = sys.argv[1:8]
last = int(last)
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/memory_copy_async.sh: step-loop blocking for in-memory copies, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# medians over the copy steps before the last, the first left out; block/copy: median of each step's")
say(f"# ckpt_block_ms / its host copy ms (rank 0's; the host copy is part of the blocking, so >= 1)")
say(f"# load average at start: {load0}, at end: {load1}; reproduce: {cmd}")
say(f"{'run':>9} {'state_MB':>8} {'copies':>6} {'block_ms':>9} {'host_copy_ms':>12} {'block/copy':>10} {'memory_copy_ms':>14}")
for rep in range(1, int(reps) + 1):
    for mode in ("sync", "async"):
        name = f"r{rep}-{mode}"
        text = open(os.path.join(tmp, name + ".node0.log"), errors="replace").read()
        copy = {int(s): float(ms) for s, ms in re.findall(r"in-memory copy of step (\d+) started: host copies \w+(?: with the disk save)? in ([0-9.]+) ms", text)}
        recs = {}
        for l in open(os.path.join(tmp, name, "metrics.jsonl")):
            r = json.loads(l)
            if "ckpt_block_ms" in r: recs[r["step"]] = r
        steps = sorted(s for s in copy if s < last)[1:]
        mb = [float(m) for m in re.findall(r"checkpoint \S+ saved: ([0-9.]+) MB from rank 0", text)]
        block = statistics.median(recs[s]["ckpt_block_ms"] for s in steps)
        host = statistics.median(copy[s] for s in steps)
        ratio = statistics.median(recs[s]["ckpt_block_ms"] / copy[s] for s in steps)
        mem = [r["memory_copy_ms"] for r in recs.values() if "memory_copy_ms" in r]
        say(f"{name:>9} {max(mb, default=0):>8.1f} {len(steps):>6} {block:>9.1f} {host:>12.1f} {ratio:>10.2f} {statistics.median(mem):>14.1f}")
        per = ", ".join("%d: %.1f/%.1f" % (s, recs[s]["ckpt_block_ms"], copy[s]) for s in steps)
        say(f"#   per step (block ms / host copy ms): {{{per}}}")
open(out_path, "w").write("\n".join(lines) + "\n")
PYEOF
