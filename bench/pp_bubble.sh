#!/usr/bin/env bash
# Pipeline bubble on this machine: for pp 2 and 4, m = 1, 2, 4, 8 micro-batches
# and the gpipe / 1f1b / zb_h1 schedules (and interleaved_1f1b at pp 2, v 2), each
# stage's measured idle fraction (the share of the schedule's wall time it sat
# blocked in receives, pending sends and the loss all-reduce, logged by the
# engine at the end of the run) next to the simulator's and the ideal
# (p-1)/(m+p-1) (interleaved: (p-1)/(v m+p-1); zb_h1: (p-1)/(3m+p-1)); stage 0's step peak bytes of
# 1F1B against GPipe (GPipe keeps m micro-batches of activations, 1F1B p);
# then tokens/s of 1x1x1, 8x1x1, 2x2x2 and 1x2x4 (dp x tp x pp) on one model
# and one global batch, with the final losses compared. Correctness at scale,
# not a speed claim: pp ranks share 2 cores, so a "blocked" stage often lets
# another stage run, and the measured bubble mixes the schedule's idle time
# with the operating system's.
#   [STEPS=8] [D_MODEL=128 LAYERS=8 HEADS=4 SEQ=64 MB=4] bench/pp_bubble.sh -> bench/results/pp_bubble.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-8}"
LAYERS="${LAYERS:-8}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/pp_bubble.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "pp_bubble: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "pp_bubble: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 3 ] || { echo "pp_bubble: STEPS must be >= 3 (the first step is not timed)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

tmp="$(mktemp -d /tmp/dtrain-pp-bubble-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = run name, $2 = dp, $3 = tp, $4 = pp, $5 = micro_batch, $6 = grad_accum, then --set overrides
  local name="$1" dp="$2" tp="$3" pp="$4" mb="$5" ga="$6"
  shift 6
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set parallel.dp="$dp" --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.zero=0 \
    --set cluster.procs_per_node=$((dp * tp * pp)) --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" \
    --set model.heads="$HEADS" --set model.seq_len="$SEQ" --set train.micro_batch="$mb" \
    --set train.grad_accum="$ga" --set train.steps="$STEPS" --set train.warmup_steps=1 \
    --set log.every=1 --set log.dir="$tmp/$name" --set checkpoint.dir='""' "$@" \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; echo "pp_bubble: $name failed" >&2; exit 1; }
  echo "$name done" >&2
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for p in 2 4; do
  for m in 1 2 4 8; do
    for sched in gpipe 1f1b zb_h1; do run "p${p}_m${m}_${sched}" 1 1 "$p" "$MB" "$m" --set parallel.pipeline.schedule="$sched"; done
  done
done
for m in 2 4 8; do
  run "p2_m${m}_interleaved" 1 1 2 "$MB" "$m" --set parallel.pipeline.schedule=interleaved_1f1b \
    --set parallel.pipeline.virtual_stages=2
done
# One global batch of 8 * MB samples in every layout.
run mesh_1x1x1 1 1 1 "$MB" 8
run mesh_8x1x1 8 1 1 "$MB" 1
run mesh_2x2x2 2 2 2 "$MB" 4
run mesh_1x2x4 1 2 4 "$MB" 8

CMD="STEPS=$STEPS LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB bench/pp_bubble.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$LAYERS $D_MODEL $HEADS $SEQ $MB $STEPS" <<'EOF'
import glob, json, os, re, statistics, sys, time
tmp, out_path, cmd, load0 = sys.argv[1:5]
L, C, heads, T, mb, steps = (int(x) for x in sys.argv[5].split())
BUBBLE = re.compile(r"pipeline rank (\d+): measured bubble ([0-9.]+)% .*simulated ([0-9.]+)%, ideal ([0-9.]+)%")

def stages(name):  # per pp rank: (measured %, simulated %, ideal %), from each rank's log
    found = {}
    for path in glob.glob(os.path.join(tmp, name, "rank_*.log")):
        for m in BUBBLE.finditer(open(path).read()):
            found[int(m.group(1))] = tuple(float(m.group(i)) for i in (2, 3, 4))
    return [found[r] for r in sorted(found)]

def metrics(name):
    return [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/pp_bubble.sh: pipeline bubble on this machine, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {L} d_model {C} heads {heads} seq_len {T}, micro_batch {mb}, {steps} steps (first not timed), "
    f"fp32, gloo on {os.cpu_count()} cores; load average before: {load0}")
say("# measured = share of the schedule's wall time a stage was blocked (recv, pending sends, loss all-reduce);")
say("# p pipeline ranks share the cores, so a blocked stage lets another run: not the GPU's idle time")
say()
say("| p | m | schedule | measured bubble per stage (%) | mean | simulated | ideal | stage-0 step peak (MiB) |")
say("|---|---|---|---|---|---|---|---|")
peaks = {}
for p in (2, 4):
    for m in (1, 2, 4, 8):
        for sched in ("gpipe", "1f1b", "zb_h1", "interleaved"):
            name = f"p{p}_m{m}_{sched}"
            if not os.path.isdir(os.path.join(tmp, name)):
                continue
            st = stages(name)
            assert len(st) == p, f"{name}: {len(st)} stage summaries for pp {p}"
            peak = max(r["peak_bytes"] for r in metrics(name)) / 2**20
            peaks[(p, m, sched)] = peak
            meas = [s[0] for s in st]
            say(f"| {p} | {m} | {sched}{' v2' if sched == 'interleaved' else ''} | {' / '.join(f'{x:.1f}' for x in meas)} | "
                f"{statistics.mean(meas):.1f} | {st[0][1]:.1f} | {st[0][2]:.1f} | {peak:.2f} |")
say()
say("stage-0 step peak, GPipe / 1F1B and zb_h1 / 1F1B (GPipe holds m micro-batches in flight, 1F1B and zb_h1 min(p, m)):")
for p in (2, 4):
    say("  p " + str(p) + ": " + ", ".join(f"m {m}: {peaks[(p, m, 'gpipe')] / peaks[(p, m, '1f1b')]:.2f}x / "
                                          f"{peaks[(p, m, 'zb_h1')] / peaks[(p, m, '1f1b')]:.2f}x" for m in (1, 2, 4, 8)))
say()
say(f"tokens/s on one global batch of {8 * mb} samples ({8 * mb * T} tokens), median over steps 2..{steps}:")
say("| dp x tp x pp | ranks | tok/s | vs 1x1x1 | final loss | rel diff vs 1x1x1 |")
say("|---|---|---|---|---|---|")
ref = None
for name, ranks in (("mesh_1x1x1", 1), ("mesh_8x1x1", 8), ("mesh_2x2x2", 8), ("mesh_1x2x4", 8)):
    recs = metrics(name)
    tok = statistics.median(r["tokens_per_s"] for r in recs[1:])
    loss = recs[-1]["loss"]
    if ref is None:
        ref = (tok, loss)
    say(f"| {name[5:]} | {ranks} | {tok:.0f} | {tok / ref[0]:.2f}x | {loss:.6f} | {abs(loss - ref[1]) / abs(ref[1]):.1e} |")
say()
say(f"reproduce: {cmd}")
open(out_path, "w").write("\n".join(lines) + "\n")
EOF
