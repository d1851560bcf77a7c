#!/usr/bin/env bash
# TP traffic: bytes each rank sends through the tp group in one steady
# training step (metrics.jsonl tp_bytes_sent, the median over steps 2..end)
# at tp 2 and 4 (dp 1, pp 1), against the Megatron figure for the engine's
# collectives and against `dtrain topo --format json` for the same spec.
# Per micro-batch, with A = micro_batch*seq_len*d_model*4 bytes and
# E = micro_batch*seq_len*4 bytes, AR(x) = 2(n-1)/n * x (comm's booking):
#   4 per block (2 forward, 2 backward) + embedding + head  -> (4L + 2) AR(A)
#   vocab-parallel cross-entropy (max, sum of exp, target)  -> 3 AR(E)
# and once per step the fp64 squared grad norm              -> AR(8).
# Not a speed test: the counts are comm's accounting, not Gloo's wire.
#   [STEPS=6] [TPS="2 4"] [D_MODEL=64 HEADS=4 LAYERS=2 SEQ=64 MB=4 GA=1] bench/tp_traffic.sh
#     -> bench/results/tp_traffic.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-6}"
TPS="${TPS:-2 4}"
LAYERS="${LAYERS:-2}" D_MODEL="${D_MODEL:-64}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}" GA="${GA:-1}"
OUT="${OUT:-$ROOT/bench/results/tp_traffic.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "tp_traffic: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "tp_traffic: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 3 ] || { echo "tp_traffic: STEPS must be >= 3 (steps 2.. are the steady ones)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

tmp="$(mktemp -d /tmp/dtrain-tp-traffic-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

sets() {  # $1 = tp: the spec overrides shared by launch and topo
  echo --set parallel.tp="$1" --set parallel.dp=1 --set parallel.pp=1 --set parallel.zero=0 \
    --set cluster.procs_per_node="$1" --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" \
    --set model.heads="$HEADS" --set model.seq_len="$SEQ" --set train.micro_batch="$MB" \
    --set train.grad_accum="$GA" --set train.steps="$STEPS" --set train.warmup_steps=1 \
    --set log.every=1 --set checkpoint.dir='""'
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for tp in $TPS; do
  # shellcheck disable=SC2046  # sets prints words meant to be split
  "$BUILD/apps/dtrain/dtrain" topo configs/quickstart.yaml $(sets "$tp") --format json \
    >"$tmp/topo$tp.json" 2>"$tmp/topo$tp.err" || { cat "$tmp/topo$tp.err" >&2; echo "tp_traffic: topo tp $tp failed" >&2; exit 1; }
  # shellcheck disable=SC2046
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml $(sets "$tp") --set log.dir="$tmp/tp$tp" \
    >"$tmp/tp$tp.log" 2>&1 || { cat "$tmp/tp$tp.log" >&2; echo "tp_traffic: tp $tp failed" >&2; exit 1; }
  echo "tp $tp done" >&2
done

CMD="STEPS=$STEPS TPS=\"$TPS\" LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB GA=$GA bench/tp_traffic.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$TPS" "$LAYERS $D_MODEL $HEADS $SEQ $MB $GA $STEPS" <<'EOF'
import json, os, statistics, sys, time
tmp, out_path, cmd, load0, tps = sys.argv[1:6]
L, C, heads, T, mb, ga, steps = (int(x) for x in sys.argv[6].split())
tps = [int(x) for x in tps.split()]
V = 256  # configs/quickstart.yaml: byte-level vocabulary

def ar(x, n):  # comm's booking of one all-reduce of x bytes, rounded down per call
    return 2 * (n - 1) * x // n

A, E = mb * T * C * 4, mb * T * 4
def formula(n):
    return ga * ((4 * L + 2) * ar(A, n) + 3 * ar(E, n)) + ar(8, n)
def old_topo(n):  # topo's figure before it counted the embedding, head, cross-entropy and norm
    return ga * L * 4 * ar(A, n)

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/tp_traffic.sh: tp bytes sent per rank per step, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {L} d_model {C} heads {heads} seq_len {T} vocab {V}; dp 1, pp 1, tp over gloo on "
    f"{os.cpu_count()} cores; micro_batch {mb}, grad_accum {ga}, {steps} steps, fp32")
say(f"# measured = rank 0's tp_bytes_sent (metrics.jsonl), median of steps 2..{steps} (min = max unless noted); "
    f"step 1 shown apart")
say(f"# formula = grad_accum * ((4L + 2) AR(A) + 3 AR(E)) + AR(8), A = {A} B activation, E = {E} B "
    f"cross-entropy vector, AR(x) = 2(n-1)/n x")
say(f"# topo = rank 0's tp group bytes_per_step in `dtrain topo SPEC --format json` (same --set overrides)")
say(f"# old_topo = grad_accum * L * 4 * AR(A), topo's figure before the embedding/head/cross-entropy/norm terms")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'tp':>3} {'measured_B':>11} {'formula_B':>11} {'meas/form':>10} {'topo_B':>11} {'meas/topo':>10} "
    f"{'old_topo_B':>11} {'meas/old':>9} {'step1_B':>11}")
notes = []
for n in tps:
    recs = [json.loads(l) for l in open(os.path.join(tmp, f"tp{n}", "metrics.jsonl")) if l.strip()]
    vals = [r["tp_bytes_sent"] for r in recs if r["step"] >= 2]
    first = [r["tp_bytes_sent"] for r in recs if r["step"] == 1][0]
    med = statistics.median(vals)
    topo = json.load(open(os.path.join(tmp, f"topo{n}.json")))
    tg = [g for g in topo["groups"] if g["axis"] == "tp" and 0 in g["ranks"]]
    if len(tg) != 1:
        sys.exit(f"tp_traffic: topo tp {n} lists {len(tg)} tp groups holding rank 0")
    t = tg[0]["bytes_per_step"]
    f, o = formula(n), old_topo(n)
    say(f"{n:>3} {med:>11.0f} {f:>11} {med / f:>10.6f} {t:>11} {med / t:>10.6f} {o:>11} {med / o:>9.4f} {first:>11}")
    if min(vals) != max(vals):
        notes.append(f"tp {n}: steady steps range {min(vals)}..{max(vals)}")
    if med != f:
        notes.append(f"tp {n}: measured differs from the formula by {med - f:+.0f} B")
    if t != f:
        notes.append(f"tp {n}: topo differs from the formula by {t - f:+.0f} B")
for note in notes:
    say("# NOTE " + note)
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
EOF
