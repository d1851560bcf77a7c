#!/usr/bin/env bash
# How long the step loop is stopped for checkpoints, checkpoint.async false vs
# true: the sum of ckpt_block_ms (and of ckpt_write_ms) over a run's
# metrics.jsonl, on a model larger than the tests' (2 processes, dp 2, CPU;
# the defaults give rank 0 about 128 MB of model + AdamW state to save),
# saving every EVERY steps. Runs interleave (sync, async, sync, ...) so load
# drifts hit both. Ratios: async / sync blocking before the last step, and
# each async save's blocking / its host copy time (rank 0's "host copies
# taken in" line: one in-memory copy of the rank's state; where the copies run
# in the background during the next step, "taken in the background: ... in
# X ms" is the copy and the block is the save step's plus the next step's wait).
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
import json, os, re, statistics, sys, time
tmp, out_path, cmd, load0, reps = sys.argv[1:6]
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/ckpt_async.sh: step-loop blocking for checkpoints, sync vs async, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# per run: sums over metrics.jsonl of ckpt_block_ms / ckpt_write_ms (rank 0); *_mid: steps before the last")
say(f"# (the last step's save is waited for in both modes); async_mid/sync_mid is the blocking ratio;")
say(f"# block/copy: each async save's ckpt_block_ms over its host copy time (max over the saves before the last)")
say(f"# load average at start: {load0}; reproduce: {cmd}")
say(f"{'rep':>3} {'state_MB':>8} {'block_sync_ms':>13} {'block_async_ms':>14} {'sync_mid':>9} {'async_mid':>9} {'async/sync':>10} {'copy_ms':>8} {'block/copy':>10} {'write_sync_ms':>13} {'write_async_ms':>14}")
last = int(os.environ.get("STEPS", "20"))
def sums(name):
    b = w = mid = 0.0
    per = {}
    for l in open(os.path.join(tmp, name, "metrics.jsonl")):
        r = json.loads(l)
        if "ckpt_block_ms" not in r: continue
        b += r["ckpt_block_ms"]; w += r.get("ckpt_write_ms", 0.0)
        if r["step"] < last: mid += r["ckpt_block_ms"]
        per[r["step"]] = r["ckpt_block_ms"]
    return b, w, mid, per
def copies(name):  # step -> host copy ms, and rank 0's MB written, from the run's log
    text = open(os.path.join(tmp, name + ".log"), errors="replace").read()
    copy = {int(m[0]): float(m[1]) for m in re.findall(r"checkpoint of step (\d+) started \(async\): host copies taken in ([0-9.]+) ms", text)}
    copy.update({int(m[0]): float(m[1]) for m in re.findall(r"host copies of step (\d+) taken in the background: [0-9.]+ MB in ([0-9.]+) ms", text)})
    mb = [float(m) for m in re.findall(r"committed \(async\): ([0-9.]+) MB from rank 0", text)]
    return copy, max(mb, default=0.0)
for rep in range(1, int(reps) + 1):
    bs, ws, ms, _ = sums(f"r{rep}-async_false")
    ba, wa, ma, per = sums(f"r{rep}-async_true")
    copy, mb = copies(f"r{rep}-async_true")
    saves = [s for s in copy if s < last]
    # a save's blocking: its step's, plus the next step's wait for copies still running (not itself a save)
    block_of = lambda s: per[s] + (per.get(s + 1, 0.0) if s + 1 not in copy else 0.0)
    worst = max((block_of(s) / copy[s] for s in saves if copy[s] > 0), default=float("nan"))
    copy_ms = statistics.median([copy[s] for s in saves]) if saves else float("nan")
    r = lambda x, y: x / y if y > 0 else float("inf")
    say(f"{rep:>3} {mb:>8.1f} {bs:>13.1f} {ba:>14.1f} {ms:>9.1f} {ma:>9.1f} {r(ma, ms):>10.3f} {copy_ms:>8.1f} {worst:>10.2f} {ws:>13.1f} {wa:>14.1f}")
    say(f"#   async per step (block ms / copy ms): {{{', '.join(f'{k}: {v:.1f}' + (f'/{copy[k]:.1f}' if k in copy else '') for k, v in per.items())}}}")
open(out_path, "w").write("\n".join(lines) + "\n")
PYEOF
