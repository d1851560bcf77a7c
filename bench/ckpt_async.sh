#!/usr/bin/env bash
# How long the step loop is stopped for checkpoints, checkpoint.async false vs
# true: the sum of ckpt_block_ms (and of ckpt_write_ms) over a run's
# metrics.jsonl, on a model larger than the tests' (2 processes, dp 2, CPU),
# saving every EVERY steps. Runs interleave (sync, async, sync, ...) so load
# drifts hit both; the ratio is sync / async blocking.
#   [LAYERS=6 D_MODEL=384 HEADS=6 STEPS=20 EVERY=5 REPS=2] bench/ckpt_async.sh
#     -> bench/results/ckpt_async.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
LAYERS="${LAYERS:-6}" D_MODEL="${D_MODEL:-384}" HEADS="${HEADS:-6}" STEPS="${STEPS:-20}" EVERY="${EVERY:-5}"
REPS="${REPS:-2}"
OUT="${OUT:-$ROOT/bench/results/ckpt_async.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "ckpt_async: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
tmp="$(mktemp -d /tmp/dtrain-ckpt-async-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for mode in false true; do
    name="r$rep-async_$mode"
    "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set cluster.procs_per_node=2 --set parallel.dp=2 \
      --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
      --set train.steps="$STEPS" --set train.warmup_steps=1 --set log.every="$STEPS" \
      --set checkpoint.every="$EVERY" --set checkpoint.async="$mode" --set checkpoint.keep=1 \
      --set log.dir="$tmp/$name" --set checkpoint.dir="$tmp/$name/ckpt" >"$tmp/$name.log" 2>&1 ||
      { cat "$tmp/$name.log" >&2; echo "ckpt_async: $name failed" >&2; exit 1; }
    echo "$name done" >&2
  done
done
CMD="LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS STEPS=$STEPS EVERY=$EVERY REPS=$REPS bench/ckpt_async.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$REPS" <<'PYEOF'
import json, os, sys, time
tmp, out_path, cmd, load0, reps = sys.argv[1:6]
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/ckpt_async.sh: step-loop blocking for checkpoints, sync vs async, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# per run: sums over metrics.jsonl of ckpt_block_ms / ckpt_write_ms (rank 0); *_mid: steps before the last")
say(f"# (the last step's save is waited for in both modes); per-step async blocking: {{step: ms}}")
say(f"# load average at start: {load0}; reproduce: {cmd}")
say(f"{'rep':>3} {'block_sync_ms':>13} {'block_async_ms':>14} {'ratio':>6} {'sync_mid':>9} {'async_mid':>9} {'ratio_mid':>9} {'write_sync_ms':>13} {'write_async_ms':>14}")
last = int(os.environ.get("STEPS", "20"))
def sums(name):
    b = w = mid = 0.0
    per = {}
    for l in open(os.path.join(tmp, name, "metrics.jsonl")):
        r = json.loads(l)
        if "ckpt_block_ms" not in r: continue
        b += r["ckpt_block_ms"]; w += r.get("ckpt_write_ms", 0.0)
        if r["step"] < last: mid += r["ckpt_block_ms"]
        per[r["step"]] = round(r["ckpt_block_ms"], 1)
    return b, w, mid, per
for rep in range(1, int(reps) + 1):
    bs, ws, ms, _ = sums(f"r{rep}-async_false")
    ba, wa, ma, per = sums(f"r{rep}-async_true")
    r = lambda x, y: x / y if y > 0 else float("inf")
    say(f"{rep:>3} {bs:>13.1f} {ba:>14.1f} {r(bs, ba):>6.2f} {ms:>9.1f} {ma:>9.1f} {r(ms, ma):>9.2f} {ws:>13.1f} {wa:>14.1f}")
    say(f"#   async per step: {per}")
open(out_path, "w").write("\n".join(lines) + "\n")
PYEOF
