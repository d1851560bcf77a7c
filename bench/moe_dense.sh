#!/usr/bin/env bash
# Dense vs MoE at the same active parameters per token, one worker (dp 1,
# ep 1: compute and routing only, no all-to-all): a small GPT trained STEPS
# steps on data/corpus.txt as dense and as MoE with E = 4, 8 experts, top-1
# and top-2, every block MoE. Matched: an expert's hidden width is
# 4 * d_model / top_k, so the k chosen experts of a token do the dense MLP's
# matmul FLOPs (and hold its weights); MoE adds the router (E * d_model) and
# k - 1 output biases. Reported: the LM loss at the last step and averaged
# over the last 10% of steps (the logged loss minus moe_aux_loss), the steady
# tokens/s (the median over the steps after the first 10%) and both as
# ratios to dense. The machine is shared: ROUNDS rounds run the five models
# in turn, each round's ratios against that round's dense run, reported as
# their median and range, with the load average beside them (the losses are
# deterministic: every round must repeat them exactly).
#   [STEPS=300] [ROUNDS=2] [D_MODEL=64 LAYERS=2 SEQ=64 MB=16] bench/moe_dense.sh -> bench/results/moe_dense.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-300}" ROUNDS="${ROUNDS:-2}" D_MODEL="${D_MODEL:-64}" LAYERS="${LAYERS:-2}" SEQ="${SEQ:-64}" MB="${MB:-16}"
OUT="${OUT:-$ROOT/bench/results/moe_dense.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "moe_dense: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "moe_dense: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
tmp="$(mktemp -d /tmp/dtrain-moe-dense-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
run() {  # $1 = name, then --set pairs
  local name="$1"; shift
  "$BUILD/apps/dtrain/dtrain" launch configs/moe.yaml --set cluster.procs_per_node=1 --set parallel.dp=1 \
    --set parallel.ep=1 --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.seq_len="$SEQ" \
    --set train.micro_batch="$MB" --set train.steps="$STEPS" --set log.every=1 --set log.dir="$tmp/$name" \
    --set checkpoint.dir='""' "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; echo "moe_dense: $name failed" >&2; exit 1; }
  cut -d' ' -f1 /proc/loadavg >"$tmp/$name.load"  # the 1-minute load as the run ends
  echo "$name done (load $(cat "$tmp/$name.load"))" >&2
}
moe() {  # $1 = experts, $2 = top_k
  run "${R}_moe_e$1_k$2" --set model.moe.experts="$1" --set model.moe.top_k="$2" --set model.moe.every=1 \
    --set model.moe.d_ff=$((4 * D_MODEL / $2))
}
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  R="r$round"
  run "${R}_dense" --set model.moe.experts=0
  moe 4 1
  moe 4 2
  moe 8 1
  moe 8 2
done
CMD="STEPS=$STEPS ROUNDS=$ROUNDS D_MODEL=$D_MODEL LAYERS=$LAYERS SEQ=$SEQ MB=$MB bench/moe_dense.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$D_MODEL $LAYERS $SEQ $MB $STEPS $ROUNDS" <<'PYEOF'
import json, os, statistics, sys, time
tmp, out_path, cmd, load0 = sys.argv[1:5]
C, L, T, mb, steps, rounds = (int(x) for x in sys.argv[5].split())
def load(name):
    return [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
names = ["dense", "moe_e4_k1", "moe_e4_k2", "moe_e8_k1", "moe_e8_k2"]
R = [f"r{i}" for i in range(1, rounds + 1)]
runs = {(r, n): load(f"{r}_{n}") for r in R for n in names}
def lm(r):  # the logged loss includes the MoE aux loss
    return r["loss"] - r.get("moe_aux_loss", 0.0)
def tail(recs):
    return recs[-max(1, len(recs) // 10):]
def steady(recs):
    return sorted(r["tokens_per_s"] for r in recs[max(1, len(recs) // 10):] if "tokens_per_s" in r)
def steady_tps(recs):
    return statistics.median(steady(recs))
def fast_tps(recs):  # the 90th percentile: the steps least slowed by other jobs
    xs = steady(recs)
    return xs[int(0.9 * (len(xs) - 1))]
def active(E, k):  # per token, per block: the MLP (or k experts and the router), the rest equal
    dense = 8 * C * C + 5 * C
    if E == 0: return dense
    F = 4 * C // k
    return k * (2 * C * F + F + C) + E * C
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/moe_dense.sh: dense vs MoE at matched active parameters, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {L} (every block MoE) d_model {C} heads 4 seq_len {T}, micro_batch {mb}, {steps} steps, lr 1e-3, "
    f"fp32, data/corpus.txt; 1 worker (dp 1, ep 1), {os.cpu_count()} cores shared with other jobs")
say(f"# expert d_ff = 4 * d_model / top_k: top-1 {4 * C}, top-2 {4 * C // 2}; capacity_factor 1.25, aux_loss_coef 0.01; "
    f"active/blk = one block's MLP (or router + k experts) parameters a token uses")
say(f"# lm_loss = loss - moe_aux_loss at step {steps}; last10% = its mean over the last {len(tail(runs[(R[0], 'dense')]))} "
    f"steps; dropped, max_load: means over the last 10%")
say(f"# tok/s = median over the steps after the first 10%, per round; ratio = vs that round's dense; "
    f"{rounds} round(s): median [min..max]; p90_ratio: the same with each run's 90th-percentile tok/s "
    f"(the steps least slowed by other jobs); load_avg: 1-minute load average as each round's run ended")
say(f"# load average at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
same = all([lm(x) for x in runs[(r, n)]] == [lm(x) for x in runs[(R[0], n)]] for r in R for n in names)
say(f"# losses identical in every round: {'yes' if same else 'NO'}")
b_last = sum(lm(x) for x in tail(runs[(R[0], 'dense')])) / len(tail(runs[(R[0], 'dense')]))
say(f"{'run':<10} {'E':>2} {'k':>2} {'active/blk':>10} {'lm_loss':>8} {'last10%':>8} {'vs_dense':>8} {'dropped':>8} "
    f"{'max_load':>8} {'tok/s':>8} {'tok/s_ratio [range]':>22} {'p90_ratio [range]':>22} {'load_avg':>12}")
for n in names:
    recs = runs[(R[0], n)]
    E = 0 if n == "dense" else int(n.split("_")[1][1:])
    k = 1 if n == "dense" else int(n.split("_")[2][1:])
    last = sum(lm(x) for x in tail(recs)) / len(tail(recs))
    drop = sum(x.get("moe_dropped", 0.0) for x in tail(recs)) / len(tail(recs))
    ml = sum(x.get("moe_max_load", 0.0) for x in tail(recs)) / len(tail(recs))
    tps = [steady_tps(runs[(r, n)]) for r in R]
    ratios = [steady_tps(runs[(r, n)]) / steady_tps(runs[(r, "dense")]) for r in R]
    loads = "/".join(open(os.path.join(tmp, f"{r}_{n}.load")).read().strip() for r in R)
    rr = f"{statistics.median(ratios):.3f} [{min(ratios):.3f}..{max(ratios):.3f}]"
    fast = [fast_tps(runs[(r, n)]) / fast_tps(runs[(r, "dense")]) for r in R]
    fr = f"{statistics.median(fast):.3f} [{min(fast):.3f}..{max(fast):.3f}]"
    say(f"{n:<10} {E:>2} {k:>2} {active(E, k):>10} {lm(recs[-1]):>8.4f} {last:>8.4f} {last / b_last:>8.4f} "
        f"{drop:>8.4f} {ml:>8.3f} {statistics.median(tps):>8.0f} {rr:>22} {fr:>22} {loads:>12}")
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
PYEOF
