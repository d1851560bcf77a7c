#!/usr/bin/env bash
# TP scaling on this machine: tokens/s, step peak bytes and the loss of
# tp 1, 2, 4 (dp 1, pp 1) on one model and one global batch, so every run
# trains the same sequence of updates. A correctness-at-scale table, not a
# speed claim: on a 2-core machine 4 ranks share 2 cores and Gloo runs over
# loopback. The losses must agree to ~1e-6 relative at every logged step;
# a negative control (tp 1 with lr x (1 + CONTROL_EPS)) shows that a change
# that small is visible at that tolerance.
#   [STEPS=20] [TPS="1 2 4"] [D_MODEL=64 HEADS=4 LAYERS=2 SEQ=64 MB=4] [CONTROL_EPS=1e-3] bench/tp_scaling.sh
#     -> bench/results/tp_scaling.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-20}"
TPS="${TPS:-1 2 4}"
LAYERS="${LAYERS:-2}" D_MODEL="${D_MODEL:-64}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}"
CONTROL_EPS="${CONTROL_EPS:-1e-3}"
OUT="${OUT:-$ROOT/bench/results/tp_scaling.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "tp_scaling: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "tp_scaling: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 4 ] || { echo "tp_scaling: STEPS must be >= 4 (steps 3.. are the timed ones)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
LR="$(sed -n 's/^ *lr: *\([0-9.eE+-]*\).*/\1/p' configs/quickstart.yaml | head -1)"
CONTROL_LR="$("$PY" -c "print(repr($LR * (1 + $CONTROL_EPS)))")"

tmp="$(mktemp -d /tmp/dtrain-tp-scaling-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = run name, $2 = tp, then extra --set overrides
  local name="$1" tp="$2"
  shift 2
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set parallel.tp="$tp" --set parallel.dp=1 --set parallel.pp=1 --set parallel.zero=0 \
    --set cluster.procs_per_node="$tp" --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" \
    --set model.heads="$HEADS" --set model.seq_len="$SEQ" --set train.micro_batch="$MB" \
    --set train.grad_accum=1 --set train.steps="$STEPS" --set train.warmup_steps=1 \
    --set log.every=1 --set log.dir="$tmp/$name" --set checkpoint.dir='""' "$@" \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; echo "tp_scaling: $name failed" >&2; exit 1; }
  echo "$name done" >&2
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for tp in $TPS; do run "tp$tp" "$tp"; done
run control 1 --set train.lr="$CONTROL_LR"

CMD="STEPS=$STEPS TPS=\"$TPS\" LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB CONTROL_EPS=$CONTROL_EPS bench/tp_scaling.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$TPS" "$CONTROL_EPS" "$LR" "$LAYERS $D_MODEL $HEADS $SEQ $MB $STEPS" <<'EOF'
import json, os, re, statistics, sys, time
tmp, out_path, cmd, load0, tps, eps, lr = sys.argv[1:8]
L, C, heads, T, mb, steps = (int(x) for x in sys.argv[8].split())
tps = [int(x) for x in tps.split()]
TOL = 1e-6  # relative, on the loss at every logged step

def load(name):
    recs = [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
    rows = [l.split("\t") for l in open(os.path.join(tmp, name, "memory.tsv")).read().splitlines()[1:]]
    P = int(re.search(r"model gpt: (\d+) parameters", open(os.path.join(tmp, name + ".log")).read()).group(1))
    return dict(recs=recs, loss={r["step"]: r["loss"] for r in recs}, P=P,
                param_b=[int(r[1]) for r in rows], run_peak=[int(r[4]) for r in rows])

runs = {n: load(f"tp{n}") for n in tps}
control = load("control")
ref = runs[tps[0]]

def rel_diffs(run):  # |loss - ref| / |ref| at every logged step
    return [abs(run["loss"][s] - ref["loss"][s]) / abs(ref["loss"][s]) for s in sorted(ref["loss"])]

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/tp_scaling.sh: tensor parallelism on this machine, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {L} d_model {C} heads {heads} seq_len {T} vocab 256, P = {ref['P']} parameters; dp 1, pp 1, "
    f"micro_batch {mb}, grad_accum 1 (global batch {mb * T} tokens), {steps} steps, fp32, gloo on {os.cpu_count()} cores")
say("# not a speed claim: tp ranks share the cores, so tok/s falls with tp here; the table checks that")
say("# tp runs train the same model and what each rank holds")
say(f"# tok/s = median of rank 0's tokens_per_s over steps 3..{steps}; step_ms the median step_time_s")
say("# peak_B = the largest peak_bytes (live CPU tensor bytes within a step) over ranks and steps (memory.tsv);")
say("# param_B = rank 0's parameter bytes (TP slices + replicated LayerNorms, biases of row-parallel layers, wpe)")
say(f"# loss = rank 0's at step {steps}; rel_diff = |loss - tp {tps[0]}| / tp {tps[0]} at the last step, "
    f"max_rel = the largest over all {steps} steps (tolerance {TOL:g})")
say(f"# control = tp 1 with train.lr {lr} x (1 + {eps}): a change the tolerance must see (in_tol must be no)")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'run':>8} {'tok/s':>8} {'vs_tp1':>7} {'step_ms':>8} {'peak_B':>10} {'vs_tp1':>7} {'param_B':>9} "
    f"{'final_loss':>19} {'rel_diff':>9} {'max_rel':>9} {'in_tol':>6}")
def row(name, run):
    steady = [r for r in run["recs"] if r["step"] >= 3]
    tok = statistics.median(r["tokens_per_s"] for r in steady)
    ms = statistics.median(r["step_time_s"] for r in steady) * 1e3
    peak = max(run["run_peak"])
    d = rel_diffs(run)
    ok = "yes" if max(d) <= TOL else "no"
    base_tok = statistics.median(r["tokens_per_s"] for r in ref["recs"] if r["step"] >= 3)
    say(f"{name:>8} {tok:>8.0f} {tok / base_tok:>7.3f} {ms:>8.2f} {peak:>10} {peak / max(ref['run_peak']):>7.3f} "
        f"{run['param_b'][0]:>9} {run['loss'][steps]:>19.12f} {d[-1]:>9.2e} {max(d):>9.2e} {ok:>6}")
    return max(d)
worst = max(row(f"tp {n}", runs[n]) for n in tps)
ctl = row("control", control)
say(f"largest relative loss difference tp vs tp {tps[0]}: {worst:.2e} (tolerance {TOL:g}); "
    f"negative control: {ctl:.2e} ({ctl / TOL:.0f}x the tolerance)")
if worst > TOL:
    say("# NOTE the tp runs disagree beyond the tolerance")
if ctl <= 10 * TOL:
    say("# NOTE the negative control is within 10x the tolerance: the check cannot tell runs apart")
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
EOF
