#!/usr/bin/env bash
# Step peak vs seq_len for train.recompute none / selective / full (and
# model.attention tiled with none), measured (rank 0's largest step peak in
# <log.dir>/memory.tsv, counting allocator) next to `dtrain plan`'s
# prediction for rank 0, one process, dropout 0.1, STEPS steps per run.
#   [SEQS="64 128 256 512"] [LAYERS=4 D_MODEL=128 HEADS=4 MB=4 STEPS=3] bench/recompute_memory.sh
#     -> bench/results/recompute_memory.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
SEQS="${SEQS:-64 128 256 512}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" MB="${MB:-4}" STEPS="${STEPS:-3}"
OUT="${OUT:-$ROOT/bench/results/recompute_memory.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "recompute_memory: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
tmp="$(mktemp -d /tmp/dtrain-recompute-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for s in $SEQS; do
  for mode in none selective full tiled; do
    rc="$mode" att=naive
    [ "$mode" = tiled ] && rc=none att=tiled
    sets=(--set cluster.procs_per_node=1 --set parallel.dp=1 --set model.layers="$LAYERS" --set model.d_model="$D_MODEL"
          --set model.heads="$HEADS" --set model.seq_len="$s" --set model.dropout=0.1 --set train.micro_batch="$MB"
          --set train.steps="$STEPS" --set train.warmup_steps=1 --set train.recompute="$rc" --set model.attention="$att")
    name="s$s-$mode"
    "$BUILD/apps/dtrain/dtrain" plan configs/quickstart.yaml "${sets[@]}" --format json >"$tmp/$name.plan.json"
    "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml "${sets[@]}" --set log.every=1 \
      --set log.dir="$tmp/$name" --set checkpoint.dir='""' >"$tmp/$name.log" 2>&1 ||
      { cat "$tmp/$name.log" >&2; echo "recompute_memory: $name failed" >&2; exit 1; }
    echo "$name done" >&2
  done
done
CMD="SEQS=\"$SEQS\" LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS MB=$MB STEPS=$STEPS bench/recompute_memory.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$SEQS" <<'PYEOF'
import json, os, sys, time
tmp, out_path, cmd, load0, seqs = sys.argv[1:6]
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/recompute_memory.sh: rank 0's step peak vs seq_len per recompute mode, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# measured = memory.tsv peak_bytes (largest step peak); predicted = dtrain plan's peak_bytes for rank 0")
say(f"# load average at start: {load0}; reproduce: {cmd}")
say(f"{'seq':>5} {'mode':<10} {'measured_B':>12} {'predicted_B':>12} {'pred/meas':>9} {'vs none':>8}")
for s in seqs.split():
    none = None
    for mode in ("none", "selective", "full", "tiled"):
        name = f"s{s}-{mode}"
        rows = [l.split("\t") for l in open(os.path.join(tmp, name, "memory.tsv")).read().splitlines()[1:]]
        meas = int(rows[0][4])
        plan = json.load(open(os.path.join(tmp, name + ".plan.json")))
        pred = plan["ranks"][0]["peak_bytes"]
        none = none or meas
        say(f"{s:>5} {mode if mode != 'tiled' else 'tiled/none':<10} {meas:>12} {pred:>12} {pred / meas:>9.3f} {meas / none:>8.3f}")
open(out_path, "w").write("\n".join(lines) + "\n")
PYEOF
