#!/usr/bin/env bash
# TP activation memory with and without sequence parallelism: rank 0's step
# peak (metrics.jsonl peak_bytes: live CPU tensor bytes within a step, seen
# by the counting allocator) minus its persistent bytes (param + grad +
# optimizer) at tp 1 and at tp 2 and 4 with parallel.sequence_parallel off
# and on (dp 1, pp 1), on a model whose activations dominate, against the
# per-layer activation formulas of Korthikanti et al. 2022 ("Reducing
# Activation Recomputation in Large Transformer Models", fp16 bytes):
#   no parallelism        s*b*h*(34 + 5*a*s/h)
#   tensor parallel       s*b*h*(10 + 24/t + 5*a*s/(h*t))
#   tensor + sequence     s*b*h/t*(34 + 5*a*s/h)
# converted to this engine's fp32 (4-byte activations AND 4-byte dropout
# masks; the paper's constants assume 2-byte activations and 1-byte masks):
#   no parallelism        s*b*h*(72 + 12*a*s/h)
#   tensor parallel       s*b*h*(24 + 48/t + 12*a*s/(h*t))
#   tensor + sequence     s*b*h/t*(72 + 12*a*s/h)
# The peak also holds the embedding, ln_f, the logits and the loss's tensors
# and backward's temporaries, so compare ratios (SP / no SP at one tp, tp t /
# tp 1), not absolute bytes. The final losses of all runs must agree to
# 1e-6 relative (layout-invariant dropout).
#   [STEPS=6] [TPS="2 4"] [LAYERS=2 D_MODEL=128 HEADS=4 SEQ=128 MB=8 DROPOUT=0.1] bench/tp_activation.sh
#     -> bench/results/tp_activation.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-6}"
TPS="${TPS:-2 4}"
LAYERS="${LAYERS:-2}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-128}" MB="${MB:-8}"
DROPOUT="${DROPOUT:-0.1}"
OUT="${OUT:-$ROOT/bench/results/tp_activation.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "tp_activation: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "tp_activation: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 3 ] || { echo "tp_activation: STEPS must be >= 3 (steps 2.. are the steady ones)" >&2; exit 2; }
for tp in $TPS; do
  [ "$tp" -ge 2 ] || { echo "tp_activation: TPS lists tp >= 2 only (tp 1 always runs, as the base)" >&2; exit 2; }
done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

tmp="$(mktemp -d /tmp/dtrain-tp-activation-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = run name, $2 = tp, $3 = sequence_parallel (true/false)
  local name="$1" tp="$2" sp="$3"
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set parallel.tp="$tp" --set parallel.dp=1 --set parallel.pp=1 --set parallel.zero=0 \
    --set parallel.sequence_parallel="$sp" --set cluster.procs_per_node="$tp" \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set model.dropout="$DROPOUT" --set train.micro_batch="$MB" \
    --set train.grad_accum=1 --set train.steps="$STEPS" --set train.warmup_steps=1 \
    --set log.every=1 --set log.dir="$tmp/$name" --set checkpoint.dir='""' \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; echo "tp_activation: $name failed" >&2; exit 1; }
  echo "$name done" >&2
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
run tp1 1 false
for tp in $TPS; do
  run "tp${tp}" "$tp" false
  run "tp${tp}sp" "$tp" true
done

CMD="STEPS=$STEPS TPS=\"$TPS\" LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB DROPOUT=$DROPOUT bench/tp_activation.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$TPS" "$LAYERS $D_MODEL $HEADS $SEQ $MB $STEPS" "$DROPOUT" <<'EOF'
import json, os, re, sys, time
tmp, out_path, cmd, load0, tps, dims, dropout = sys.argv[1:8]
L, h, a, s, b, steps = (int(x) for x in dims.split())
tps = [int(x) for x in tps.split()]
V = 256  # configs/quickstart.yaml: byte-level vocabulary
TOL = 1e-6  # relative, on the final loss

def korthikanti_fp16(t, sp):  # bytes per layer, the paper's fp16 figure (2-byte activations, 1-byte masks)
    if t == 1:
        return s * b * h * (34 + 5 * a * s / h)
    if sp:
        return s * b * h / t * (34 + 5 * a * s / h)
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))

def formula(t, sp):  # bytes per layer in fp32: activations x 2 bytes, dropout masks 1 -> 4 bytes
    # 34 sbh = 32 sbh of 2-byte activations + 2 sbh of 1-byte masks (attention and MLP residual dropout);
    # 5 as^2b = 4 as^2b of 2-byte activations (softmax output, dropout output) + 1 as^2b mask;
    # tp: 10 sbh = 8 sbh activations (2 LayerNorm inputs, 2 LayerNorm outputs) + 2 sbh masks, all whole.
    if t == 1:
        return s * b * h * (72 + 12 * a * s / h)
    if sp:
        return s * b * h / t * (72 + 12 * a * s / h)
    return s * b * h * (24 + 48 / t + 12 * a * s / (h * t))

def saved(t, sp):
    # This engine's autograd-saved bytes at the end of the forward (fp32 elements x 4), read off
    # engine/model/gpt.cpp and tp_ops.cpp. Per layer: LayerNorm inputs and both dropout masks hold
    # T/tsp positions (tsp = t with SP, else 1); the LayerNorm outputs are saved whole by the qkv and
    # fc linears (with SP: the all-gathered copy; the paper keeps the shard and re-gathers in backward);
    # q/k/v, the attention output, fc output and GELU output are split by t; softmax output, its
    # dropout mask and the dropped probabilities [b, a/t, s, s]; LayerNorm mean/rstd [b, s/tsp] x 2
    # each; the cached causal bias [s, s] (not in param/grad/optimizer bytes).
    # Outside the layers: the embedding's dropout mask and ln_f's input (T/tsp), ln_f's output (whole),
    # the loss's saved [b*s, V/t] (log_softmax output at tp 1, exp(z) under tp) and O(b*s) index/mask
    # vectors (ignored).
    tsp = t if sp else 1
    sbh = s * b * h
    layer = 2 * sbh + 4 * sbh / tsp + 12 * sbh / t + 3 * a * s * s * b / t + 4 * b * s / tsp + s * s
    outside = 2 * sbh / tsp + sbh + b * s * V / t
    return 4 * (L * layer + outside)

def load(name):
    recs = [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
    P = int(re.search(r"model gpt: (\d+) parameters", open(os.path.join(tmp, name + ".log")).read()).group(1))
    steady = [r for r in recs if r["step"] >= 2]  # step 1 allocates the optimizer state
    peaks = [r["peak_bytes"] for r in steady]
    pers = [r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"] for r in steady]
    return dict(P=P, loss={r["step"]: r["loss"] for r in recs}, peak=max(peaks), peak_min=min(peaks),
                persistent=max(pers), persistent_min=min(pers), step1_peak=recs[0]["peak_bytes"])

runs = [(1, False, "tp1")] + [x for t in tps for x in ((t, False, f"tp{t}"), (t, True, f"tp{t}sp"))]
data = {name: load(name) for _, _, name in runs}
base = data["tp1"]
act = {name: data[name]["peak"] - data[name]["persistent"] for _, _, name in runs}

lines = []
def say(x=""):
    lines.append(x)
    print(x)

say(f"# bench/tp_activation.sh: activation memory with and without sequence parallelism, "
    f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {L} d_model {h} heads {a} seq_len {s} vocab {V} dropout {dropout}, P = {base['P']} parameters; "
    f"dp 1, pp 1, micro_batch {b}, grad_accum 1, {steps} steps, fp32, gloo on {os.cpu_count()} cores")
say(f"# peak_B = rank 0's peak_bytes (metrics.jsonl), the largest over steps 2..{steps} (step 1 also allocates "
    f"Adam's state); persistent_B = param_bytes + grad_bytes + optimizer_bytes; activation_B = peak_B - persistent_B")
say(f"# formula_B = {L} layers x Korthikanti et al. 2022 per layer in fp32 with 4-byte dropout masks: "
    f"sbh(72 + 12as/h), tp sbh(24 + 48/t + 12as/(ht)), tp+sp sbh/t(72 + 12as/h)")
say(f"#   (their fp16 figures x 2 bytes for activations and x 4 for the 1-byte masks; x 2 throughout would give "
    f"sbh(68 + 10as/h) at tp 1: {L * 2 * korthikanti_fp16(1, False):.0f} B here)")
say(f"# saved_B = what this engine's autograd holds at the end of the forward by its code (layers, embedding "
    f"dropout mask, ln_f, the loss's [b*s, V/t]): differs from the paper in keeping the all-gathered LayerNorm")
say(f"#   outputs whole under SP (8 sbh bytes per layer at any t) and in the terms outside the layers")
say(f"# vs_tp1 = activation_B / tp 1's (meas) and formula_B / tp 1's (form)")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'tp':>3} {'sp':>3} {'peak_B':>10} {'persistent_B':>12} {'activation_B':>12} {'formula_B':>10} "
    f"{'meas/form':>9} {'vs_tp1':>6} {'(form)':>6} {'saved_B':>10} {'meas/saved':>10}")
notes = []
for t, sp, name in runs:
    d = data[name]
    f, sv = L * formula(t, sp), saved(t, sp)
    say(f"{t:>3} {'on' if sp else 'off':>3} {d['peak']:>10} {d['persistent']:>12} {act[name]:>12} {f:>10.0f} "
        f"{act[name] / f:>9.3f} {act[name] / act['tp1']:>6.3f} {f / (L * formula(1, False)):>6.3f} "
        f"{sv:>10.0f} {act[name] / sv:>10.3f}")
    if d["peak"] != d["peak_min"]:
        notes.append(f"{name}: steady peaks range {d['peak_min']}..{d['peak']}")
    if d["persistent"] != d["persistent_min"]:
        notes.append(f"{name}: persistent bytes range {d['persistent_min']}..{d['persistent']}")
say()
say("SP saving = 1 - activation(sp on) / activation(sp off) at the same tp; measured from the largest steady")
say("peaks (as in the table) and from the smallest (min_peaks); formula and saved from the columns above")
say(f"{'tp':>3} {'measured':>9} {'min_peaks':>9} {'formula':>8} {'saved':>8}")
act_min = {name: data[name]["peak_min"] - data[name]["persistent"] for _, _, name in runs}
for t in tps:
    m = 1 - act[f"tp{t}sp"] / act[f"tp{t}"]
    mm = 1 - act_min[f"tp{t}sp"] / act_min[f"tp{t}"]
    f = 1 - formula(t, True) / formula(t, False)
    sv = 1 - saved(t, True) / saved(t, False)
    say(f"{t:>3} {m:>9.3f} {mm:>9.3f} {f:>8.3f} {sv:>8.3f}")
say()
final = {name: data[name]["loss"][steps] for _, _, name in runs}
ref = final["tp1"]
rel = {name: abs(final[name] - ref) / abs(ref) for name in final}
every = max(abs(data[name]["loss"][k] - base["loss"][k]) / abs(base["loss"][k])
            for _, _, name in runs for k in base["loss"])
say(f"final loss (step {steps}) per run: " + ", ".join(f"{name} {final[name]:.12f}" for _, _, name in runs))
worst = max(rel.values())
say(f"largest relative final-loss difference vs tp 1: {worst:.2e} (tolerance {TOL:g}, "
    f"{'ok' if worst <= TOL else 'EXCEEDED'}); over all {steps} steps: {every:.2e}")
for note in notes:
    say("# NOTE " + note)
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
if worst > TOL:
    sys.exit("tp_activation: final losses disagree beyond the tolerance")
EOF
