#!/usr/bin/env bash
# Two builds of dtrain A/B under perf, for changes too small to see in
# tokens/s on a shared machine: BEFORE (a build dir) against this one, DDP
# at 2 ranks (one thread each) at the compute-bound size (bench/fused_ab.sh's),
# in interleaved rounds (before first in odd rounds). Per run: perf
# cpu-clock samples of both ranks for SECONDS_REC s from step 20, folded by
# symbol into SYMBOLS groups (name=regex, first match wins; the rest is "other"),
# as CPU ms per step and rank and as a share of the ranks' samples. The
# shares are what to compare: the machine's speed moves the ms of every
# category together, not one category's share.
# ENV_BEFORE / ENV_AFTER set environment variables for one side only (as
# bench/fused_ab.sh's: BEFORE=build ENV_BEFORE="DTRAIN_X=0" is one build, a
# toggle A/B).
#   BEFORE=DIR [ROUNDS=3] [STEPS=60] [SECONDS_REC=15] [SYMBOLS="sgemm=sgemm copy=direct_copy_kernel ..."]
#   [EXTRA=...] [ENV_BEFORE=...] [ENV_AFTER=...] [OUT=...] bench/profile_ab.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
BEFORE="${BEFORE:?set BEFORE to the build dir to compare against}"
ROUNDS="${ROUNDS:-3}" STEPS="${STEPS:-60}" SECONDS_REC="${SECONDS_REC:-15}" EXTRA="${EXTRA:-}"
ENV_BEFORE="${ENV_BEFORE:-}" ENV_AFTER="${ENV_AFTER:-}"
SYMBOLS="${SYMBOLS:-sgemm=sgemm copy=direct_copy_kernel memmove=memmove adamw=adamw_run}"
OUT="${OUT:-$ROOT/bench/results/profile_ab.txt}"
cd "$ROOT"
command -v perf >/dev/null || { echo "profile_ab: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
for b in "$BUILD" "$BEFORE"; do
  [ -x "$b/apps/dtrain/dtrain" ] && [ -x "$b/apps/dtrain/dtrain-worker" ] || {
    echo "profile_ab: no dtrain and dtrain-worker in $b/apps/dtrain" >&2; exit 2; }
done
pgrep -x dtrain-worker >/dev/null && { echo "profile_ab: a dtrain-worker is already running" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-profab-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = build dir, $2 = label, $3 = round
  local dir="$tmp/$2$3" envs="$ENV_AFTER"
  [ "$2" = before ] && envs="$ENV_BEFORE"
  # shellcheck disable=SC2086
  env $envs "$1/apps/dtrain/dtrain" launch configs/quickstart.yaml --set train.steps="$STEPS" --set log.every=10 \
    --set log.dir="$dir" --set checkpoint.dir='""' --set model.layers=4 --set model.d_model=512 \
    --set model.heads=8 --set model.seq_len=128 --set train.micro_batch=4 --set parallel.dp=2 \
    --set cluster.procs_per_node=2 --set parallel.ddp.bucket_mb=1 --set train.lr=1e-3 \
    --set train.warmup_steps=20 $EXTRA >"$dir.log" 2>&1 &
  local top=$!
  for _ in $(seq 900); do grep -q "step 20/" "$dir.log" 2>/dev/null && break; sleep 0.2; done
  local pids; pids="$(pgrep -d, -x dtrain-worker)" || { cat "$dir.log" >&2; exit 1; }
  perf record -q -F 499 -e cpu-clock -p "$pids" -o "$dir.data" -- sleep "$SECONDS_REC" 2>/dev/null || true
  wait "$top" || { tail "$dir.log" >&2; echo "profile_ab: $2 failed" >&2; exit 1; }
  perf report -q -i "$dir.data" --no-children --sort sym -F sample,sym --stdio 2>/dev/null >"$dir.syms"
  python3 - "$dir" "$2" "$3" "$SECONDS_REC" "$SYMBOLS" <<'PY' >>"$tmp/rows"
import json, re, sys
d, label, rnd, window, groups = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5].split()
pats = [(g.split('=', 1)[0], re.compile(g.split('=', 1)[1])) for g in groups]
counts = {name: 0 for name, _ in pats}
counts['other'] = 0
for line in open(d + '.syms'):
    m = re.match(r'\s*(\d+)\s+\[.\]\s+(.*)', line)
    if not m:
        continue
    name = next((n for n, p in pats if p.search(m.group(2))), 'other')
    counts[name] += int(m.group(1))
recs = [json.loads(l) for l in open(d + '/metrics.jsonl') if l.strip()]
first = next(r for r in recs if r['step'] >= 20)
step_ms = (recs[-1]['elapsed_s'] - first['elapsed_s']) / (recs[-1]['step'] - first['step']) * 1e3
steps = window * 1e3 / step_ms
total = sum(counts.values())
print(json.dumps({'label': label, 'round': int(rnd), 'step_ms': step_ms,
                  'ms': {k: v / 499 / 2 / steps * 1e3 for k, v in counts.items()},
                  'share': {k: 100.0 * v / total for k, v in counts.items()}, 'all_ms': total / 499 / 2 / steps * 1e3}))
PY
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run "$BEFORE" before "$r"; run "$BUILD" after "$r"
  else run "$BUILD" after "$r"; run "$BEFORE" before "$r"; fi
done
{
  echo "# bench/profile_ab.sh: $BUILD (after, commit $(git rev-parse --short HEAD)) vs $BEFORE (before), $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# DDP 2 ranks x 1 thread on $(nproc --all) cores; gpt 4 x 512, heads 8, seq 128, micro_batch 4, bucket 1 MB; $STEPS steps;"
  echo "# perf cpu-clock 499 Hz on both ranks for $SECONDS_REC s from step 20; ms = CPU ms per step and rank; extra: ${EXTRA:-none}"
  echo "# environment: before ${ENV_BEFORE:-(none)}, after ${ENV_AFTER:-(none)}"
  echo "# load before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 - "$tmp/rows" "$SYMBOLS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = [g.split('=', 1)[0] for g in sys.argv[2].split()] + ['other']
print(f"{'round':>5} {'build':>6} {'wall_ms':>8} {'cpu_ms':>7} " + ' '.join(f"{n + '_ms':>10} {n + '_%':>8}" for n in names))
for r in rows:
    print(f"{r['round']:5d} {r['label']:>6} {r['step_ms']:8.1f} {r['all_ms']:7.1f} " +
          ' '.join(f"{r['ms'][n]:10.1f} {r['share'][n]:8.2f}" for n in names))
for n in names:
    b = statistics.median(r['share'][n] for r in rows if r['label'] == 'before')
    a = statistics.median(r['share'][n] for r in rows if r['label'] == 'after')
    print(f"# {n}: median share of the samples before {b:.2f}%, after {a:.2f}%")
PY
  echo "# reproduce: BEFORE=$BEFORE ROUNDS=$ROUNDS STEPS=$STEPS SECONDS_REC=$SECONDS_REC SYMBOLS=\"$SYMBOLS\" ENV_BEFORE=\"$ENV_BEFORE\" ENV_AFTER=\"$ENV_AFTER\" bench/profile_ab.sh"
} | tee "$OUT"
