#!/usr/bin/env bash
# dtrain vs a Python peer at RANKS CPU ranks, one thread per rank, for each of
# KINDS: ddp = `dtrain launch` DDP vs bench/peer/gpt_ddp.py (PyTorch DDP),
# zero3 = parallel.zero 3 vs gpt_fsdp.py (FSDP2 fully_shard), pp = parallel.pp
# with the 1f1b schedule and RANKS micro-batches vs gpt_pp.py (Schedule1F1B);
# same GPT, data and batch, gloo, the peer launched by the venv's torchrun.
# SIZE=quickstart (configs/quickstart.yaml's GPT: d_model 128) or compute
# (d_model 512, 4 layers, seq 128, micro_batch 4: most of a step in sgemm).
# Both sides run
# the same PyTorch wheel (the venv's LibTorch for the engine, its Python for
# the peer), so the same kernels and BLAS (the wheel's MKL).
# Runs are interleaved (every rank count in every round; dtrain first in odd
# rounds, the peer first in even ones) so drift hits both. Both time from the
# end of the first logged step (10) to the last step. Beside tokens/s, each
# side's rank 0 reports its process CPU time per step over the same window
# (all its threads: the peer's Gloo threads too): on a shared machine it
# moves far less than wall time, so its ratio says what the work costs. OPENBLAS_CORETYPE, MKL_CBWR and the like reach
# both sides unchanged (the header says which were set). With several rank
# counts the last table is the scaling: tokens/s and efficiency vs 1 rank
# (tok/s at n / (n x tok/s at 1), from the medians).
# GLOO_TOO=1 adds a third side: dtrain with cluster.shm false (every
# all-reduce over Gloo's TCP, as the peer's), to show what the shared-memory
# all-reduce is worth. THIRD_ENV="VAR=value ..." makes the third side dtrain
# with that environment instead (e.g. DTRAIN_SYMMETRIC_BUFFERS=0: the engine
# with one change undone, against the same peer in the same rounds). The
# third side runs last in odd rounds and first in even ones.
#   [KINDS="ddp zero3 pp"] [SIZE=compute] [RANKS="2 4"] [ROUNDS=3] [STEPS=150] [GLOO_TOO=1 | THIRD_ENV=...]
#   [DTRAIN_VENV=...] bench/peer_ratio.sh   -> bench/results/peer_ratio.txt (OUT=...)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-150}"
OUT="${OUT:-$ROOT/bench/results/peer_ratio.txt}"
# The venv scripts/install-deps makes; the engine links the LibTorch inside it.
VENV="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}"
PY="$VENV/bin/python"
cd "$ROOT"

# The quickstart's sizes (configs/quickstart.yaml), passed to both sides.
LAYERS=4 D_MODEL=128 HEADS=4 SEQ=64 MB=8 LR=1e-3 WARMUP=20 BUCKET=1 EVERY=10
SIZE="${SIZE:-quickstart}"
case "$SIZE" in
  quickstart) ;;
  compute) D_MODEL=512 HEADS=8 SEQ=128 MB=4 ;;
  *) echo "peer_ratio: SIZE=$SIZE: use quickstart or compute" >&2; exit 2 ;;
esac
RANKS="${RANKS:-4}"
KINDS="${KINDS:-ddp}"
for k in $KINDS; do
  case "$k" in ddp|zero3|pp) ;; *) echo "peer_ratio: KINDS has '$k': use ddp, zero3 or pp" >&2; exit 2 ;; esac
done

[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "peer_ratio: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
"$PY" -c 'import torch.distributed.run' 2>/dev/null || {
  echo "peer_ratio: $PY cannot import torch.distributed.run (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
CORES="$(nproc --all)"
TORCH="$("$PY" -c 'import torch; print(torch.__version__)')"
BLAS="$("$PY" -c 'import torch; print(next((l.strip().lstrip("- ").split("-Product")[0] for l in torch.__config__.show().splitlines() if "Math Kernel" in l or "BLAS_INFO" in l), "?"))')"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

tmp="$(mktemp -d /tmp/dtrain-peer-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# The layout of kind $1 at $2 ranks, as dtrain --set arguments (pp: one stage
# per rank and as many micro-batches, the peer's default).
layout() {
  case "$1" in
    ddp) echo "--set parallel.dp=$2 --set parallel.zero=0" ;;
    zero3) echo "--set parallel.dp=$2 --set parallel.zero=3" ;;
    pp) echo "--set parallel.dp=1 --set parallel.zero=0 --set parallel.pp=$2 --set train.grad_accum=$2 --set parallel.pipeline.schedule=1f1b" ;;
  esac
}

dtrain_run() {  # $1 = round, $2 = ranks, $3 = cluster.shm, $4 = kind, [$5 = VAR=value pairs]; prints "tokens/s cpu_ms_per_step"
  local n="$2" dir="$tmp/dtrain$1_$2_$3_$4${5:+_env}"
  # shellcheck disable=SC2046,SC2086
  env ${5:-} "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set cluster.shm="$3" $(layout "$4" "$n") \
    --set train.steps="$STEPS" --set log.every="$EVERY" --set log.dir="$dir" \
    --set checkpoint.dir='""' --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" \
    --set model.heads="$HEADS" --set model.seq_len="$SEQ" --set train.micro_batch="$MB" \
    --set cluster.procs_per_node="$n" --set train.lr="$LR" \
    --set train.warmup_steps="$WARMUP" --set parallel.ddp.bucket_mb="$BUCKET" \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "peer_ratio: dtrain failed" >&2; exit 1; }
  # metrics.jsonl also has a record for step 1: start at step $EVERY, as the peer does.
  "$PY" - "$dir/metrics.jsonl" "$((MB * n * SEQ))" "$EVERY" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(r for r in recs if r['step'] >= int(sys.argv[3]))
last = recs[-1]
steps = last['step'] - first['step']
print(f"{steps * int(sys.argv[2]) / (last['elapsed_s'] - first['elapsed_s']):.1f} "
      f"{1e3 * (last['cpu_s'] - first['cpu_s']) / steps:.2f}")
EOF
}

peer_run() {  # $1 = round, $2 = ranks, $3 = kind; prints "tokens/s cpu_ms_per_step"
  local log="$tmp/peer$1_$2_$3.log" script extra=""
  case "$3" in
    ddp) script=gpt_ddp.py extra="--bucket-mb $BUCKET" ;;
    zero3) script=gpt_fsdp.py ;;
    pp) script=gpt_pp.py extra="--schedule 1f1b" ;;
  esac
  set +e
  # shellcheck disable=SC2086
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$2" \
    "bench/peer/$script" --data data/corpus.txt \
    --layers "$LAYERS" --d-model "$D_MODEL" --heads "$HEADS" --seq-len "$SEQ" \
    --micro-batch "$MB" --steps "$STEPS" --lr "$LR" --warmup-steps "$WARMUP" \
    $extra --log-every "$EVERY" >"$log" 2>&1
  local rc=$?
  set -e
  local line; line="$(grep 'PEER kind=' "$log" | tail -1)"
  # Rank 0 prints its PEER line after the last step, which every rank's
  # collectives reach: a non-zero exit after it is a crash at teardown
  # (PyTorch's Gloo threads at exit, seen with FSDP2 at 4 ranks), said on
  # stderr, and the measurement stands. Without the line the run failed.
  if [ $rc -ne 0 ] && [ -z "$line" ]; then cat "$log" >&2; echo "peer_ratio: peer exited $rc" >&2; exit 1; fi
  [ $rc -ne 0 ] && echo "peer_ratio: the peer exited $rc after its result ($(grep -m1 -o 'terminate called.*' "$log" || echo 'see its log')); kept" >&2
  echo "$(grep -o 'tokens_per_s=[0-9.]*' <<<"$line" | cut -d= -f2) $(grep -o 'rank0_cpu_ms_per_step=[0-9.]*' <<<"$line" | cut -d= -f2)"
}

THIRD_NAME="third side"
[ "${GLOO_TOO:-0}" = 1 ] && THIRD_NAME="dtrain with cluster.shm false"
[ "${GLOO_TOO:-0}" != 1 ] && [ -n "${THIRD_ENV:-}" ] && THIRD_NAME="dtrain with $THIRD_ENV"
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
declare -A D P G DC PC GC
third() {  # $1 = round, $2 = ranks, $3 = kind: the third side's "tokens/s cpu_ms", or "- -"
  if [ "${GLOO_TOO:-0}" = 1 ]; then dtrain_run "$1" "$2" false "$3"
  elif [ -n "${THIRD_ENV:-}" ]; then dtrain_run "$1" "$2" true "$3" "$THIRD_ENV"
  else echo "- -"; fi
}
for r in $(seq "$ROUNDS"); do
  for k in $KINDS; do
    for n in $RANKS; do
      # (assigned first: a failing run's exit status stops the script under set -e)
      if [ $((r % 2)) = 1 ]; then
        d="$(dtrain_run "$r" "$n" true "$k")"; p="$(peer_run "$r" "$n" "$k")"; g="$(third "$r" "$n" "$k")"
      else
        g="$(third "$r" "$n" "$k")"; p="$(peer_run "$r" "$n" "$k")"; d="$(dtrain_run "$r" "$n" true "$k")"
      fi
      read -r "D[$k,$r,$n]" "DC[$k,$r,$n]" <<<"$d"
      read -r "P[$k,$r,$n]" "PC[$k,$r,$n]" <<<"$p"
      read -r "G[$k,$r,$n]" "GC[$k,$r,$n]" <<<"$g"
      echo "round $r, $k, $n ranks: dtrain ${D[$k,$r,$n]} tok/s (${DC[$k,$r,$n]} CPU ms/step), peer ${P[$k,$r,$n]} tok/s (${PC[$k,$r,$n]}), $THIRD_NAME ${G[$k,$r,$n]} (${GC[$k,$r,$n]})" >&2
    done
  done
done
OVERRIDES="$(env | grep -E '^(OPENBLAS_CORETYPE|MKL_CBWR|MKL_ENABLE_INSTRUCTIONS|ATEN_CPU_CAPABILITY)=' | tr '\n' ' ' || true)"

{
  echo "# bench/peer_ratio.sh: dtrain launch vs PyTorch peers (torchrun, gloo): $KINDS, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# ranks $RANKS on $CORES cores, 1 thread/rank (OMP/MKL/OPENBLAS=1), torch $TORCH from $VENV on both sides"
  echo "# BLAS on both sides: $BLAS; kernel overrides on both sides: ${OVERRIDES:-none}"
  echo "# load average (1/5/15 min) at start: $LOAD0, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# size $SIZE: GPT layers $LAYERS d_model $D_MODEL heads $HEADS seq_len $SEQ, micro_batch $MB per rank, $STEPS steps, bucket $BUCKET MB"
  echo "# peers: ddp = gpt_ddp.py (DDP), zero3 = gpt_fsdp.py (FSDP2), pp = gpt_pp.py (Schedule1F1B, micro-batches = ranks)"
  echo "# cpu_ms = rank 0's process CPU time per step (all its threads); cpu_ratio = peer / dtrain"
  echo "# tokens/s from the end of step $EVERY to the last step; rounds interleaved"
  echo "# third side (columns third_*): $THIRD_NAME"
  ROWS=""
  for k in $KINDS; do
  for n in $RANKS; do
    echo "## $k, $n ranks (GBS $((MB * n)))"
    printf "%-6s %14s %14s %8s %12s %12s %9s %13s %12s %11s\n" round dtrain_tok_s peer_tok_s ratio \
      dtrain_cpu_ms peer_cpu_ms cpu_ratio third_tok_s third_cpu_ms third_ratio
    ds="" ps="" gs="" dcs="" pcs="" gcs=""
    for r in $(seq "$ROUNDS"); do
      gr="-"
      [ "${G[$k,$r,$n]}" != "-" ] && gr="$(printf "%.3f" "$(echo "${G[$k,$r,$n]} / ${P[$k,$r,$n]}" | bc -l)")"
      printf "%-6s %14s %14s %8.3f %12s %12s %9.3f %13s %12s %11s\n" "$r" "${D[$k,$r,$n]}" "${P[$k,$r,$n]}" \
        "$(echo "${D[$k,$r,$n]} / ${P[$k,$r,$n]}" | bc -l)" "${DC[$k,$r,$n]}" "${PC[$k,$r,$n]}" \
        "$(echo "${PC[$k,$r,$n]} / ${DC[$k,$r,$n]}" | bc -l)" "${G[$k,$r,$n]}" "${GC[$k,$r,$n]}" "$gr"
      ds="$ds ${D[$k,$r,$n]}" ps="$ps ${P[$k,$r,$n]}" gs="$gs ${G[$k,$r,$n]}" dcs="$dcs ${DC[$k,$r,$n]}" pcs="$pcs ${PC[$k,$r,$n]}" gcs="$gcs ${GC[$k,$r,$n]}"
    done
    ROWS="$ROWS$k:$n:$ds:$ps:$gs:$dcs:$pcs:$gcs;"
  done
  done
  "$PY" - "$ROWS" "$THIRD_NAME" <<'EOF'
import statistics, sys
rows = []
for chunk in sys.argv[1].strip(";").split(";"):
    k, n, d, p, g, dc, pc, gc = chunk.split(":")
    d, p = [float(x) for x in d.split()], [float(x) for x in p.split()]
    dc, pc = [float(x) for x in dc.split()], [float(x) for x in pc.split()]
    md, mp = statistics.median(d), statistics.median(p)
    mr = statistics.median(a / b for a, b in zip(d, p))
    rows.append((k, int(n), md, mp))
    print(f"{k}, {n} ranks: median dtrain {md:.1f} tok/s, peer {mp:.1f} tok/s, ratio of medians {md / mp:.3f}, "
          f"median of round ratios {mr:.3f}; dtrain won {sum(a > b for a, b in zip(d, p))} "
          f"of {len(d)} rounds")
    print(f"{k}, {n} ranks: rank 0's CPU per step, medians: dtrain {statistics.median(dc):.2f} ms, peer "
          f"{statistics.median(pc):.2f} ms, peer / dtrain {statistics.median(pc) / statistics.median(dc):.3f}")
    if "-" not in g.split():
        g, gc = [float(x) for x in g.split()], [float(x) for x in gc.split()]
        print(f"{k}, {n} ranks, {sys.argv[2]}: median {statistics.median(g):.1f} tok/s, "
              f"median of round ratios vs the peer {statistics.median(a / b for a, b in zip(g, p)):.3f}; "
              f"dtrain / it: tok/s {statistics.median(a / b for a, b in zip(d, g)):.3f}, CPU per step (it / dtrain) "
              f"{statistics.median(b / a for a, b in zip(dc, gc)):.3f} (medians of round ratios)")
for kind in dict.fromkeys(r[0] for r in rows):
    of = [r for r in rows if r[0] == kind]
    base = next((r for r in of if r[1] == 1), None)
    if base and len(of) > 1:
        print(f"## {kind} scaling (medians; efficiency = tok/s at n / (n x tok/s at 1 rank))")
        print(f"{'ranks':>5s} {'dtrain_tok_s':>13s} {'eff':>6s} {'peer_tok_s':>11s} {'eff':>6s}")
        for _, n, md, mp in of:
            print(f"{n:5d} {md:13.1f} {md / (n * base[2]):6.2f} {mp:11.1f} {mp / (n * base[3]):6.2f}")
EOF
} | tee "$OUT"
