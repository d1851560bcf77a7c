#!/usr/bin/env bash
# EP traffic: bytes rank 0 sends through the ep group in one training step
# (metrics.jsonl ep_bytes_sent, the median over steps 2..end) at ep 2 and 4
# (dp 4), against the uniform-routing formula of the all-to-all: per MoE
# layer and micro-batch, four exchanges (dispatch and combine, forward and
# backward) of tokens * k * d_model * 4 bytes * (ep-1)/ep each, plus the
# forward's count exchange (E - E/ep) * 8 bytes. The measured figure follows
# the routing: a rank whose tokens prefer its own experts sends less, dropped
# assignments are not sent (moe_dropped is printed beside it).
# Not a speed test: the counts are comm's accounting of the rows it sends.
#   [STEPS=6] [EPS="2 4"] [E=4 K=2 CF=4.0 D_MODEL=64 LAYERS=2 EVERY=1 SEQ=64 MB=4] bench/moe_traffic.sh
#     -> bench/results/moe_traffic.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-6}" EPS="${EPS:-2 4}"
E="${E:-4}" K="${K:-2}" CF="${CF:-4.0}" D_MODEL="${D_MODEL:-64}" LAYERS="${LAYERS:-2}" EVERY="${EVERY:-1}"
SEQ="${SEQ:-64}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/moe_traffic.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "moe_traffic: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "moe_traffic: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
tmp="$(mktemp -d /tmp/dtrain-moe-traffic-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for ep in $EPS; do
  "$BUILD/apps/dtrain/dtrain" launch configs/moe.yaml --set parallel.ep="$ep" --set parallel.dp=4 \
    --set cluster.procs_per_node=4 --set model.moe.experts="$E" --set model.moe.top_k="$K" \
    --set model.moe.capacity_factor="$CF" --set model.moe.every="$EVERY" --set model.layers="$LAYERS" \
    --set model.d_model="$D_MODEL" --set model.seq_len="$SEQ" --set train.micro_batch="$MB" \
    --set train.steps="$STEPS" --set train.warmup_steps=1 --set log.every=1 --set checkpoint.dir='""' \
    --set log.dir="$tmp/ep$ep" >"$tmp/ep$ep.log" 2>&1 || { cat "$tmp/ep$ep.log" >&2; echo "moe_traffic: ep $ep failed" >&2; exit 1; }
  echo "ep $ep done" >&2
done
CMD="STEPS=$STEPS EPS=\"$EPS\" E=$E K=$K CF=$CF D_MODEL=$D_MODEL LAYERS=$LAYERS EVERY=$EVERY SEQ=$SEQ MB=$MB bench/moe_traffic.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$EPS" "$E $K $D_MODEL $LAYERS $EVERY $SEQ $MB $STEPS" <<'EOF'
import json, os, statistics, sys, time
tmp, out_path, cmd, load0, eps = sys.argv[1:6]
E, K, C, L, every, T, mb, steps = (int(x) for x in sys.argv[6].split())
eps = [int(x) for x in eps.split()]
moe_layers = len([i for i in range(L) if i % every == 0])
tokens = mb * T
def formula(n):
    return moe_layers * (4 * tokens * K * C * 4 * (n - 1) / n + (E - E // n) * 8)
lines = []
def say(s=""):
    lines.append(s); print(s)
say(f"# bench/moe_traffic.sh: ep bytes sent by rank 0 per step, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {L} (MoE every {every}: {moe_layers} MoE layers) d_model {C} seq_len {T}; experts {E}, top_k {K}; "
    f"dp 4, micro_batch {mb}, grad_accum 1, {steps} steps, fp32, gloo on {os.cpu_count()} cores")
say(f"# formula = MoE layers * (4 * tokens({tokens}) * k * d_model * 4 B * (ep-1)/ep + (E - E/ep) * 8 B counts)")
say(f"# measured = rank 0's ep_bytes_sent (metrics.jsonl), median of steps 2..{steps}")
say(f"# load average at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'ep':>3} {'measured_B':>11} {'formula_B':>11} {'meas/form':>10} {'min..max/form':>16} {'dropped':>8}")
for n in eps:
    recs = [json.loads(l) for l in open(os.path.join(tmp, f"ep{n}", "metrics.jsonl")) if l.strip()]
    vals = [r["ep_bytes_sent"] for r in recs if r["step"] >= 2]
    drop = max(r["moe_dropped"] for r in recs)
    f = formula(n)
    med = statistics.median(vals)
    say(f"{n:>3} {med:>11.0f} {f:>11.0f} {med / f:>10.4f} {min(vals) / f:>7.4f}..{max(vals) / f:<7.4f} {drop:>8.4f}")
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
EOF
