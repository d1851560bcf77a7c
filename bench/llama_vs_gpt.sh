#!/usr/bin/env bash
# Llama vs GPT tokens/s at equal parameters on 4 CPU ranks (dp 4, fp32,
# naive attention, data/corpus.txt): a byte-level GPT (LayerNorm, learned
# positions, GELU MLP 4C, biases) and a Llama (RMSNorm, rotary, multi-head
# attention, SwiGLU, no biases) of the same d_model, layers and heads, the
# Llama's SwiGLU width F chosen so its parameter count equals the GPT's
# (3CF per block replaces GELU's 8C^2 + 5C, the biases, LayerNorm's shifts
# and the position table). Both counts come from `dtrain plan --format json`
# and are printed. The machine is shared: ROUNDS rounds run the two in turn
# (GPT, Llama, GPT, Llama, ...), each round's ratio against that round's
# GPT, reported as the median and range with the load average beside them.
# tok/s: the median over a run's steps after the first 10%.
#   [STEPS=60] [ROUNDS=3] [D_MODEL=128 LAYERS=4 HEADS=4 SEQ=128 MB=8] bench/llama_vs_gpt.sh
#     -> bench/results/llama_vs_gpt.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-60}" ROUNDS="${ROUNDS:-3}" D_MODEL="${D_MODEL:-128}" LAYERS="${LAYERS:-4}" HEADS="${HEADS:-4}"
SEQ="${SEQ:-128}" MB="${MB:-8}"
OUT="${OUT:-$ROOT/bench/results/llama_vs_gpt.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
D="$BUILD/apps/dtrain/dtrain"
cd "$ROOT"
[ -x "$D" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "llama_vs_gpt: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "llama_vs_gpt: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-llama-gpt-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# SwiGLU width for equal parameters: L*3CF = T*C + L*(8C^2 + 11C) + C (the
# GPT's position table, MLP and biases and LayerNorm shifts beyond the Llama's).
F=$(( (SEQ * D_MODEL + LAYERS * (8 * D_MODEL * D_MODEL + 11 * D_MODEL) + D_MODEL + 3 * D_MODEL * LAYERS / 2)
      / (3 * D_MODEL * LAYERS) ))
cat >"$tmp/base.yaml" <<EOF
job: {name: llama-vs-gpt, seed: 1234}
cluster: {nodes: 1, procs_per_node: 4, device: cpu, backend: gloo}
parallel: {dp: 4, tp: 1, pp: 1}
model: {vocab: 256, layers: $LAYERS, d_model: $D_MODEL, heads: $HEADS, seq_len: $SEQ, attention: naive}
train: {steps: $STEPS, micro_batch: $MB, lr: 1.0e-3, warmup_steps: 5, precision: fp32}
data: {path: data/corpus.txt, format: bytes}
checkpoint: {dir: "", every: 0}
log: {every: 1}
EOF
GPT=(--set model.kind=gpt)
LLAMA=(--set model.kind=llama --set model.ffn_hidden="$F" --set model.kv_heads="$HEADS")
params() { "$D" plan "$tmp/base.yaml" --format json "$@" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["params"])'; }
P_GPT=$(params "${GPT[@]}")
P_LLAMA=$(params "${LLAMA[@]}")
run() {  # $1 = name, then --set pairs
  local name="$1"; shift
  "$D" launch "$tmp/base.yaml" --set log.dir="$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; echo "llama_vs_gpt: $name failed" >&2; exit 1; }
  cut -d' ' -f1 /proc/loadavg >"$tmp/$name.load"
  echo "$name done (load $(cat "$tmp/$name.load"))" >&2
}
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  run "r${round}_gpt" "${GPT[@]}"
  run "r${round}_llama" "${LLAMA[@]}"
done
CMD="STEPS=$STEPS ROUNDS=$ROUNDS D_MODEL=$D_MODEL LAYERS=$LAYERS HEADS=$HEADS SEQ=$SEQ MB=$MB bench/llama_vs_gpt.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$ROUNDS" "$P_GPT" "$P_LLAMA" "$F" \
  "$D_MODEL $LAYERS $HEADS $SEQ $MB $STEPS" <<'PYEOF'
import json, os, statistics, sys, time
tmp, out_path, cmd, load0, rounds, p_gpt, p_llama, F = sys.argv[1:9]
C, L, H, T, mb, steps = (int(x) for x in sys.argv[9].split())
R = [f"r{i}" for i in range(1, int(rounds) + 1)]
def recs(name):
    return [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
def tps(name):
    rs = [r for r in recs(name) if "tokens_per_s" in r]
    return statistics.median(r["tokens_per_s"] for r in rs[max(1, len(rs) // 10):])
def last_loss(name):
    return [r["loss"] for r in recs(name) if "loss" in r][-1]
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/llama_vs_gpt.sh: Llama vs GPT tokens/s at equal parameters, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# 4 CPU ranks (dp 4, gloo), fp32, naive attention; d_model {C}, layers {L}, heads {H}, seq_len {T}, "
    f"micro_batch {mb} per rank, {steps} steps, vocab 256, data/corpus.txt; {os.cpu_count()} cores shared with other jobs")
say(f"# params (dtrain plan): GPT {p_gpt}, Llama {p_llama} (SwiGLU hidden {F}, kv_heads {H}): "
    f"Llama/GPT = {int(p_llama) / int(p_gpt):.5f}")
say(f"# tok/s: global tokens per second, median over the steps after the first 10%; ratio: Llama / that round's GPT; "
    f"load: 1-minute load average as each run ended")
say(f"# load average at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'round':<6} {'gpt_tok/s':>10} {'llama_tok/s':>12} {'ratio':>7} {'gpt_loss':>9} {'llama_loss':>11} {'load':>11}")
ratios = []
for r in R:
    g, l = tps(f"{r}_gpt"), tps(f"{r}_llama")
    ratios.append(l / g)
    load = "/".join(open(os.path.join(tmp, f"{r}_{n}.load")).read().strip() for n in ("gpt", "llama"))
    say(f"{r:<6} {g:>10.0f} {l:>12.0f} {l / g:>7.3f} {last_loss(r + '_gpt'):>9.4f} {last_loss(r + '_llama'):>11.4f} {load:>11}")
say(f"# Llama/GPT tokens/s: median {statistics.median(ratios):.3f} [{min(ratios):.3f}..{max(ratios):.3f}] over {len(R)} rounds")
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
PYEOF
