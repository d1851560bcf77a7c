#!/usr/bin/env bash
# Two builds of dtrain end to end, A/B: BEFORE (a build dir of the engine
# before a change, e.g. without the fused kernels) against this one, DDP at
# RANKS ranks (one thread each) at the compute-bound size (d_model 512, 4
# layers, 8 heads, seq 128, micro_batch 4), for each model kind, in
# interleaved rounds (before first in odd rounds, after first in even ones).
# Per run: tokens/s and rank 0's process CPU ms per step from metrics.jsonl
# (steps EVERY..STEPS); per round the ratios after / before; the medians.
# CPU per step moves far less than wall time on a shared machine. EXTRA
# adds --set overrides to both sides (e.g. "--set parallel.zero=3");
# ENV_BEFORE / ENV_AFTER set environment variables for one side only
# (e.g. BEFORE=build ENV_BEFORE="DTRAIN_X=0": one build, a toggle A/B);
# SETS_BEFORE / SETS_AFTER add --set overrides to one side only (e.g.
# BEFORE=build EXTRA="--set parallel.zero=3" SETS_BEFORE="parallel.fsdp.shared_params=false").
#   BEFORE=DIR [KINDS="gpt llama"] [ROUNDS=3] [STEPS=40] [RANKS=2] [EXTRA=...] [ENV_BEFORE=...] [ENV_AFTER=...]
#     [SETS_BEFORE=...] [SETS_AFTER=...] [OUT=...] bench/fused_ab.sh
#   -> bench/results/fused_ab.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
KINDS="${KINDS:-gpt llama}" ROUNDS="${ROUNDS:-3}" STEPS="${STEPS:-40}" RANKS="${RANKS:-2}" EVERY=10
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-512}" HEADS="${HEADS:-8}" SEQ="${SEQ:-128}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/fused_ab.txt}"
EXTRA="${EXTRA:-}" ENV_BEFORE="${ENV_BEFORE:-}" ENV_AFTER="${ENV_AFTER:-}"
SETS_BEFORE="${SETS_BEFORE:-}" SETS_AFTER="${SETS_AFTER:-}"
BEFORE="${BEFORE:?set BEFORE to the build dir to compare against}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
for b in "$BUILD" "$BEFORE"; do
  [ -x "$b/apps/dtrain/dtrain" ] && [ -x "$b/apps/dtrain/dtrain-worker" ] || {
    echo "fused_ab: no dtrain and dtrain-worker in $b/apps/dtrain (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
done
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-fused-ab-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = name, $2 = kind, $3 = build dir, $4 = VAR=value pairs, $5 = field=value overrides; prints "tokens/s cpu_ms_per_step"
  local dir="$tmp/$1" side=()
  for kv in $5; do side+=(--set "$kv"); done
  env $4 "$3/apps/dtrain/dtrain" launch configs/quickstart.yaml --set model.kind="$2" \
    --set train.steps="$STEPS" --set log.every="$EVERY" --set log.dir="$dir" --set checkpoint.dir='""' \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set parallel.dp="$RANKS" \
    --set cluster.procs_per_node="$RANKS" --set train.lr=1e-3 --set train.warmup_steps=20 \
    --set parallel.ddp.bucket_mb=1 $EXTRA "${side[@]}" >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "fused_ab: $1 failed" >&2; exit 1; }
  "$PY" - "$dir/metrics.jsonl" "$((MB * RANKS * SEQ))" "$EVERY" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and '"step"' in l]
recs = [r for r in recs if 'elapsed_s' in r]
first = next(r for r in recs if r['step'] >= int(sys.argv[3]))
last = recs[-1]
steps = last['step'] - first['step']
print(f"{steps * int(sys.argv[2]) / (last['elapsed_s'] - first['elapsed_s']):.1f} "
      f"{1e3 * (last['cpu_s'] - first['cpu_s']) / steps:.2f}")
PYEOF
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
{
  echo "# bench/fused_ab.sh: $BUILD (after, commit $(git rev-parse --short HEAD)) vs $BEFORE (before), $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# DDP $RANKS ranks x 1 thread on $(nproc --all) cores; $LAYERS x $D_MODEL, heads $HEADS, seq $SEQ, micro_batch $MB;"
  echo "# environment: before ${ENV_BEFORE:-(none)}, after ${ENV_AFTER:-(none)}; overrides: before ${SETS_BEFORE:-(none)}, after ${SETS_AFTER:-(none)}"
  echo "# $STEPS steps, figures over steps $EVERY..$STEPS; extra overrides: ${EXTRA:-none}; load before: $LOAD0"
  echo "| kind | round | before tok/s | after tok/s | before CPU ms/step | after CPU ms/step | tok/s after/before | CPU after/before |"
  echo "|---|---|---|---|---|---|---|---|"
} | tee "$OUT"
for kind in $KINDS; do
  tr=() cr=()
  for k in $(seq "$ROUNDS"); do
    if [ $((k % 2)) -eq 1 ]; then off="$(run "${kind}_b$k" "$kind" "$BEFORE" "$ENV_BEFORE" "$SETS_BEFORE")"; on="$(run "${kind}_a$k" "$kind" "$BUILD" "$ENV_AFTER" "$SETS_AFTER")"
    else on="$(run "${kind}_a$k" "$kind" "$BUILD" "$ENV_AFTER" "$SETS_AFTER")"; off="$(run "${kind}_b$k" "$kind" "$BEFORE" "$ENV_BEFORE" "$SETS_BEFORE")"; fi
    read -r toff coff <<<"$off"; read -r ton con <<<"$on"
    t="$("$PY" -c "print(f'{$ton / $toff:.3f}')")" c="$("$PY" -c "print(f'{$con / $coff:.3f}')")"
    tr+=("$t") cr+=("$c")
    echo "| $kind | $k | $toff | $ton | $coff | $con | $t | $c |" | tee -a "$OUT"
  done
  tl="$(IFS=,; echo "${tr[*]}")" cl="$(IFS=,; echo "${cr[*]}")"
  "$PY" -c "import statistics as s; print(f'# $kind: median tok/s after/before {s.median([$tl]):.3f}, CPU ms/step after/before {s.median([$cl]):.3f}')" | tee -a "$OUT"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); reproduce: BEFORE=$BEFORE KINDS=\"$KINDS\" ROUNDS=$ROUNDS STEPS=$STEPS RANKS=$RANKS EXTRA=\"$EXTRA\" ENV_BEFORE=\"$ENV_BEFORE\" ENV_AFTER=\"$ENV_AFTER\" SETS_BEFORE=\"$SETS_BEFORE\" SETS_AFTER=\"$SETS_AFTER\" bench/fused_ab.sh" | tee -a "$OUT"
