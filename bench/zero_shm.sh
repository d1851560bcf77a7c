#!/usr/bin/env bash
# ZeRO's collectives through shared memory vs over Gloo's TCP, same binary:
# cluster.shm true (all-gathers, reduce-scatters and all-reduces of a node's
# ranks through /dev/shm) against false (Gloo's TCP for all of them, dtrain's
# ring reduce-scatter). Per ZeRO stage and dp size, rounds interleaved (on,
# off, on, off, ...) so drift hits both; per run the median step_time_s and
# sync_wait_s (exposed reduce-scatter, gather and all-reduce wait) of the
# steady steps (from step 6 on), and the last step's loss (the two paths add
# in different orders, so it may differ in the last digits).
# ratio = step(off) / step(on): > 1 means shared memory is faster.
#   [ZEROS="1 2 3"] [DPS="2 4"] [ROUNDS=3] [STEPS=30] bench/zero_shm.sh -> bench/results/zero_shm.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
ZEROS="${ZEROS:-1 2 3}"
DPS="${DPS:-2 4}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-30}"
LAYERS=4 D_MODEL=128 HEADS=4 SEQ=64 MB=8
OUT="${OUT:-$ROOT/bench/results/zero_shm.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "zero_shm: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "zero_shm: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
[ "$STEPS" -ge 10 ] || { echo "zero_shm: STEPS must be >= 10 (steps 6.. are the steady ones)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

tmp="$(mktemp -d /tmp/dtrain-zero-shm-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = true|false (cluster.shm), $2 = zero stage, $3 = dp, $4 = round
  local dir="$tmp/z$2_dp$3_$1_$4"
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set cluster.shm="$1" --set parallel.zero="$2" \
    --set parallel.dp="$3" --set cluster.procs_per_node="$3" \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.steps="$STEPS" \
    --set train.warmup_steps=5 --set log.every=1 --set log.dir="$dir" --set checkpoint.dir='""' \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "zero_shm: shm $1 zero $2 dp $3 round $4 failed" >&2; exit 1; }
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for z in $ZEROS; do
    for n in $DPS; do
      run true "$z" "$n" "$r"
      run false "$z" "$n" "$r"
    done
  done
  echo "round $r done" >&2
done
LOAD1="$(cut -d' ' -f1-3 /proc/loadavg)"

CMD="ZEROS=\"$ZEROS\" DPS=\"$DPS\" ROUNDS=$ROUNDS STEPS=$STEPS bench/zero_shm.sh"
"$PY" - "$tmp" "$OUT" "$CMD" "$LOAD0" "$LOAD1" "$ROUNDS" "$STEPS" "$ZEROS" "$DPS" <<'EOF'
import json, os, statistics, sys, time
tmp, out_path, cmd, load0, load1 = sys.argv[1:6]
rounds, steps = int(sys.argv[6]), int(sys.argv[7])
zeros, dps = sys.argv[8].split(), sys.argv[9].split()

def stats(name):
    recs = [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
    st = [r for r in recs if r["step"] >= 6]
    return (statistics.median(r["step_time_s"] for r in st), statistics.median(r["sync_wait_s"] for r in st),
            next(r["loss"] for r in recs if r["step"] == steps))

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/zero_shm.sh: ZeRO with cluster.shm true vs false, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# quickstart GPT (4 x 128, seq 64), micro_batch 8 per rank, {os.cpu_count()} cores, 1 thread/rank, "
    f"{steps} steps; per run the median of steps 6..{steps}; rounds interleaved")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {load1}")
say("# wait = sync_wait_s (time blocked on the step's collectives); ratio = step_off / step_on")
say(f"# reproduce: {cmd}")
for z in zeros:
    for n in dps:
        say(f"## ZeRO-{z}, dp {n}")
        say(f"{'round':<6} {'step_shm_ms':>12} {'step_gloo_ms':>13} {'wait_shm_ms':>12} {'wait_gloo_ms':>13} "
            f"{'ratio':>7} {'loss_shm':>10} {'loss_gloo':>10}")
        ratios, on, off = [], [], []
        for r in range(1, rounds + 1):
            s_on, w_on, l_on = stats(f"z{z}_dp{n}_true_{r}")
            s_off, w_off, l_off = stats(f"z{z}_dp{n}_false_{r}")
            ratios.append(s_off / s_on)
            on.append(s_on)
            off.append(s_off)
            say(f"{r:<6} {s_on * 1e3:12.1f} {s_off * 1e3:13.1f} {w_on * 1e3:12.1f} {w_off * 1e3:13.1f} "
                f"{s_off / s_on:7.3f} {l_on:10.6f} {l_off:10.6f}")
        say(f"ZeRO-{z} dp {n}: median step shm {statistics.median(on) * 1e3:.1f} ms, gloo "
            f"{statistics.median(off) * 1e3:.1f} ms; ratio median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}..{max(ratios):.3f}); shm faster in {sum(x > 1 for x in ratios)} of {rounds}")
open(out_path, "w").write("\n".join(lines) + "\n")
print(f"wrote {out_path}")
EOF
