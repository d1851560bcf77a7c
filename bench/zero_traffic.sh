#!/usr/bin/env bash
# ZeRO traffic: bytes each rank sends through the dp group in one steady
# training step (metrics.jsonl dp_bytes_sent, the median over steps 3..end;
# step 1 carries start-up gathers) for parallel.zero 0/1/2/3 at dp 4,
# against the ring figures for P fp32 parameters (4P bytes) over n ranks:
#   all-reduce 2(n-1)/n*4P, reduce-scatter (n-1)/n*4P, all-gather (n-1)/n*4P
#   zero 0 (DDP)  all-reduce                      2(n-1)/n*4P
#   zero 1        all-reduce + all-gather         3(n-1)/n*4P
#   zero 2        reduce-scatter + all-gather     2(n-1)/n*4P
#   zero 3        2 all-gathers + reduce-scatter  3(n-1)/n*4P (1.5x DDP)
# ZeRO-3 keeps the last unit (ln_f + head, 2C + C*V parameters) gathered
# from its forward into its backward, which saves one gather of it; the
# "engine" column is that expected figure, over the padded unit buffers,
# plus the 8-byte all-reduce of the squared grad norm (ZeRO only).
#   [STEPS=8] [DP=4] [D_MODEL=128 HEADS=4 LAYERS=4 SEQ=64 MB=4] bench/zero_traffic.sh
#     -> bench/results/zero_traffic.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-8}"
DP="${DP:-4}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/zero_traffic.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "zero_traffic: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "zero_traffic: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 4 ] || { echo "zero_traffic: STEPS must be >= 4 (steps 3.. are the steady ones)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

tmp="$(mktemp -d /tmp/dtrain-zero-traffic-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = zero stage
  local dir="$tmp/z$1"
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set parallel.zero="$1" --set parallel.dp="$DP" --set cluster.procs_per_node="$DP" \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.steps="$STEPS" \
    --set train.warmup_steps=1 --set log.every=1 --set log.dir="$dir" --set checkpoint.dir='""' \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "zero_traffic: zero $1 failed" >&2; exit 1; }
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for z in 0 1 2 3; do
  run "$z"
  echo "zero $z done" >&2
done

CMD="STEPS=$STEPS DP=$DP LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB bench/zero_traffic.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$DP $LAYERS $D_MODEL $HEADS $SEQ $MB $STEPS" <<'EOF'
import json, os, re, statistics, sys, time
tmp, out_path, cmd, load0, sizes = sys.argv[1:6]
n, layers, C, heads, T, mb, steps = (int(x) for x in sizes.split())
V = 256  # configs/quickstart.yaml: byte-level vocabulary
STAGES = [0, 1, 2, 3]

# The model's units as the engine lays them out (engine/model/gpt.cpp):
# 0 = wte + wpe, 1..layers = blocks, layers + 1 = ln_f + head.
block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)
units = [V * C + T * C] + [block] * layers + [2 * C + C * V]
padded = [-(-u // n) * n for u in units]  # each rounded up to a multiple of n
P_model = sum(units)
frac = (n - 1) / n

recs, P = {}, None
for z in STAGES:
    d = os.path.join(tmp, f"z{z}")
    P = int(re.search(r"model gpt: (\d+) parameters", open(d + ".log").read()).group(1))
    recs[z] = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
if P != P_model:
    sys.exit(f"zero_traffic: the log says P = {P}, the unit sizes here add up to {P_model}: update the unit list")

def steady(z):
    vals = [r["dp_bytes_sent"] for r in recs[z] if r["step"] >= 3]
    return statistics.median(vals), min(vals), max(vals), [r["dp_bytes_sent"] for r in recs[z] if r["step"] == 1][0]

theory = {0: 2 * frac * 4 * P, 1: 3 * frac * 4 * P, 2: 2 * frac * 4 * P, 3: 3 * frac * 4 * P}
# What the engine should send: per unit, over its padded flat buffer; the
# ZeRO stages also all-reduce one fp64 squared norm (8 bytes) for clipping.
Pp, head_p = sum(padded), padded[-1]
norm = 2 * (n - 1) * 8 // n
expected = {0: 2 * frac * 4 * P,
            1: sum(2 * (n - 1) * 4 * p // n for p in padded) + frac * 4 * Pp + norm,
            2: frac * 4 * Pp + frac * 4 * Pp + norm,
            3: frac * 4 * (2 * Pp - head_p) + frac * 4 * Pp + norm}
label = {0: "all-reduce (DDP)", 1: "all-reduce + all-gather", 2: "reduce-scatter + all-gather",
         3: "2 all-gathers + reduce-scatter"}

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/zero_traffic.sh: dp bytes sent per rank per step, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {layers} d_model {C} heads {heads} seq_len {T} vocab {V}, P = {P} parameters "
    f"(4P = {4 * P} bytes); dp {n} (gloo) on {os.cpu_count()} cores, micro_batch {mb}, {steps} steps")
say(f"# units (params): {units}; padded to a multiple of {n}: {sum(padded) - P} padding elements; head unit {units[-1]}")
say(f"# measured = rank 0's dp_bytes_sent (metrics.jsonl), median of steps 3..{steps} (min = max unless noted); "
    f"step 1 shown apart")
say(f"# theory = ring figures of 4P: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n each")
say(f"# engine = theory over the padded unit buffers, ZeRO-3 less one gather of the head unit, "
    f"+ {norm} B of grad-norm all-reduce for ZeRO")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'zero':>4} {'collectives':<31} {'measured_B':>11} {'theory_B':>11} {'meas/theory':>11} "
    f"{'engine_B':>11} {'meas/engine':>11} {'vs_DDP':>7} {'theory_vs_DDP':>13} {'step1_B':>11}")
ddp = steady(0)[0]
notes = []
for z in STAGES:
    med, lo, hi, first = steady(z)
    say(f"{z:>4} {label[z]:<31} {med:>11.0f} {theory[z]:>11.0f} {med / theory[z]:>11.4f} "
        f"{expected[z]:>11.0f} {med / expected[z]:>11.6f} {med / ddp:>7.3f} {theory[z] / theory[0]:>13.3f} {first:>11}")
    if lo != hi:
        notes.append(f"zero {z}: steady steps range {lo}..{hi}")
    if abs(med - expected[z]) > 0.5:
        notes.append(f"zero {z}: measured differs from the engine figure by {med - expected[z]:+.0f} B")
head_saving = frac * 4 * units[-1]
say(f"# ZeRO-3 without keeping the head gathered would send {theory[3] + norm:.0f} B; the kept head saves "
    f"(n-1)/n*4*{units[-1]} = {head_saving:.0f} B ({100 * head_saving / theory[3]:.2f}%), "
    f"ratio to DDP {(theory[3] - head_saving) / theory[0]:.4f} instead of 1.5")
for note in notes:
    say("# NOTE " + note)
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
EOF
