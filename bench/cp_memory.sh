#!/usr/bin/env bash
# Context parallelism at a long sequence: rank 0's step peak (counting
# allocator, memory.tsv) and activation bytes predicted by `dtrain plan`,
# tokens/s from metrics.jsonl, for parallel.cp = 1, 2, 4 at seq_len SEQ, one
# sequence per step (micro_batch 1), tiled attention, fp32. Each cp rank
# holds seq_len / cp tokens: the activation peak should fall as about 1/cp.
#   [SEQ=4096 CPS="1 2 4" LAYERS=2 D_MODEL=256 HEADS=4 STEPS=4] bench/cp_memory.sh
#     -> bench/results/cp_memory.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
SEQ="${SEQ:-4096}" CPS="${CPS:-1 2 4}"
LAYERS="${LAYERS:-2}" D_MODEL="${D_MODEL:-256}" HEADS="${HEADS:-4}" STEPS="${STEPS:-4}"
OUT="${OUT:-$ROOT/bench/results/cp_memory.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "cp_memory: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-cp-memory-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for cp in $CPS; do
  sets=(--set cluster.procs_per_node="$cp" --set parallel.dp=1 --set parallel.cp="$cp" --set model.layers="$LAYERS"
        --set model.d_model="$D_MODEL" --set model.heads="$HEADS" --set model.seq_len="$SEQ" --set model.dropout=0
        --set model.attention=tiled --set train.micro_batch=1 --set train.grad_accum=1 --set train.steps="$STEPS"
        --set train.warmup_steps=1)
  name="cp$cp"
  "$BUILD/apps/dtrain/dtrain" plan configs/quickstart.yaml "${sets[@]}" --no-probe --format json >"$tmp/$name.plan.json"
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml "${sets[@]}" --set log.every=1 \
    --set log.dir="$tmp/$name" --set checkpoint.dir='""' >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; echo "cp_memory: $name failed" >&2; exit 1; }
  echo "$name done" >&2
done
CMD="SEQ=$SEQ CPS=\"$CPS\" LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS STEPS=$STEPS bench/cp_memory.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$CPS" "$SEQ" <<'PYEOF'
import json, os, sys, time
tmp, out_path, cmd, load0, cps, seq = sys.argv[1:7]
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/cp_memory.sh: context parallelism at seq_len {seq}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say("# measured peak = memory.tsv peak_bytes of rank 0 (largest step peak, counting allocator: parameters,")
say("#   gradients, optimizer state and activations); plan = dtrain plan's rank 0 peak and activation bytes;")
say("# tokens/s = median over steps 2.. of metrics.jsonl (all ranks share this machine's cores)")
say(f"# load average at start: {load0}; reproduce: {cmd}")
say("# measured act = measured peak - (param + grad + optimizer bytes of memory.tsv): what the step adds on top")
say(f"{'cp':>3} {'measured_peak_B':>16} {'plan_peak_B':>12} {'plan/meas':>9} {'measured_act_B':>15} {'plan_act_B':>12} {'meas act vs cp1':>15} {'plan act vs cp1':>15} {'tokens/s':>9}")
base = None
for cp in cps.split():
    name = f"cp{cp}"
    rows = [l.split("\t") for l in open(os.path.join(tmp, name, "memory.tsv")).read().splitlines()[1:]]
    meas = int(rows[0][4])
    meas_act = meas - int(rows[0][1]) - int(rows[0][2]) - int(rows[0][3])
    r0 = json.load(open(os.path.join(tmp, name + ".plan.json")))["ranks"][0]
    recs = [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl"))]
    tps = sorted(r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r.get("step", 0) >= 2)
    tp = tps[len(tps) // 2] if tps else float("nan")
    base = base or (meas_act, r0["activation_bytes"])
    say(f"{cp:>3} {meas:>16} {r0['peak_bytes']:>12} {r0['peak_bytes'] / meas:>9.3f} {meas_act:>15} {r0['activation_bytes']:>12} "
        f"{meas_act / base[0]:>15.3f} {r0['activation_bytes'] / base[1]:>15.3f} {tp:>9.0f}")
open(out_path, "w").write("\n".join(lines) + "\n")
PYEOF
