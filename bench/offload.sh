#!/usr/bin/env bash
# AdamW's state in nvme files (train.offload.optimizer: nvme) against the
# same run without, on one rank of a GPT whose AdamW state is >= 1 GB
# (LAYERS x 12 x D_MODEL^2 parameters, 8 bytes each): median step time
# after the first step, peak RSS of the worker (/usr/bin/time's maxrss of
# the launch: its largest process, reached at start-up) and its RSS during the
# steps (metrics.jsonl's rss_bytes), AdamW bytes in memory and in the file
# (metrics.jsonl), and the share of the file I/O hidden behind compute:
# 1 - (time the step waited for I/O) / (time the I/O thread spent), summed
# over the steps after the first. bucket_mb and prefetch as in the spec.
# The zero3 rows run ZeRO-3 (at dp 1 each unit's shard is the whole unit),
# without offload, with the parameter shards in nvme files
# (train.offload.params: nvme), and with both: param_MiB is the most shard
# bytes in memory during a step.
# ROWS picks some of the rows (default all: none nvme nvme_noprefetch zero3
# zero3_params zero3_both).
#   [STEPS=6] [LAYERS=11 D_MODEL=1024 HEADS=8 SEQ=32 MB=1] [ROWS=...] [OFFLOAD_DIR=/tmp] bench/offload.sh
#     -> bench/results/offload.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
DTRAIN="$BUILD/apps/dtrain/dtrain"
STEPS="${STEPS:-6}"
LAYERS="${LAYERS:-11}" D_MODEL="${D_MODEL:-1024}" HEADS="${HEADS:-8}" SEQ="${SEQ:-32}" MB="${MB:-1}"
OUT="${OUT:-$ROOT/bench/results/offload.txt}"
ALL_ROWS="none nvme nvme_noprefetch zero3 zero3_params zero3_both"
ROWS="${ROWS:-$ALL_ROWS}"
[ -x "$DTRAIN" ] || { echo "offload: no $DTRAIN: build first (scripts/build)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d "${OFFLOAD_DIR:-/tmp}/dtrain-offload-bench-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/files"

run() {  # $1 = name, then --set arguments
  local name="$1"; shift
  /usr/bin/time -f "%M" -o "$tmp/$name.maxrss" "$DTRAIN" launch "$ROOT/configs/quickstart.yaml" \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set model.vocab=256 --set data.format=synthetic \
    --set train.micro_batch="$MB" --set train.steps="$STEPS" --set train.warmup_steps=1 \
    --set parallel.dp=1 --set cluster.procs_per_node=1 --set log.every=1 --set log.dir="$tmp/$name" \
    --set checkpoint.dir='""' "$@" >"$tmp/$name.log" 2>&1 ||
    { tail -30 "$tmp/$name.log" >&2; echo "offload: run $name failed" >&2; exit 1; }
}

# Median of `key` over the records after the first step; `sum` sums them.
metric() {  # $1 = run, $2 = key, $3 = median | sum | last
  python3 - "$tmp/$1/metrics.jsonl" "$2" "$3" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
vals = [r[sys.argv[2]] for r in rows[1:] if sys.argv[2] in r]
if not vals: print("-"); sys.exit()
print({"median": statistics.median, "sum": sum, "last": lambda v: v[-1]}[sys.argv[3]](vals))
PY
}

for r in $ROWS; do
  case "$r" in
    none) run none ;;
    nvme) run nvme --set train.offload.optimizer=nvme --set train.offload.path="$tmp/files" ;;
    nvme_noprefetch) run nvme_noprefetch --set train.offload.optimizer=nvme --set train.offload.path="$tmp/files" \
      --set train.offload.prefetch=false ;;
    zero3) run zero3 --set parallel.zero=3 ;;
    zero3_params) run zero3_params --set parallel.zero=3 --set train.offload.params=nvme \
      --set train.offload.path="$tmp/files" ;;
    zero3_both) run zero3_both --set parallel.zero=3 --set train.offload.params=nvme \
      --set train.offload.optimizer=nvme --set train.offload.path="$tmp/files" ;;
    *) echo "offload: unknown row '$r' (rows: $ALL_ROWS)" >&2; exit 2 ;;
  esac
done
first="${ROWS%% *}"
params="$(grep -o 'model gpt: [0-9]*' "$tmp/$first.log" | grep -o '[0-9]*$')"
{
  echo "# bench/offload.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): 1 rank, GPT layers $LAYERS d_model $D_MODEL seq $SEQ mb $MB,"
  echo "# $params parameters (AdamW state $(python3 -c "print(f'{8 * $params / 2**30:.2f}')") GiB), $STEPS steps,"
  echo "# command: STEPS=$STEPS LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB$([ "$ROWS" = "$ALL_ROWS" ] || echo " ROWS=\"$ROWS\"") bench/offload.sh"
  echo "# $(nproc --all) CPUs at load $(cut -d' ' -f1 /proc/loadavg), offload files on $(df --output=source "$tmp" | tail -1)"
  printf '%-16s %12s %14s %14s %12s %16s %16s %12s %12s %10s\n' run step_s peak_rss_MiB step_rss_MiB param_MiB \
    optimizer_MiB offload_MiB io_ms wait_ms hidden
  for r in $ROWS; do
    step="$(metric "$r" step_time_s median)"
    rss="$(($(cat "$tmp/$r.maxrss") / 1024))"
    step_rss="$(metric "$r" rss_bytes median)"
    par="$(metric "$r" param_bytes last)"
    opt="$(metric "$r" optimizer_bytes last)"
    off="$(metric "$r" offload_bytes last)"
    io="$(metric "$r" offload_io_ms sum)"
    wait="$(metric "$r" offload_wait_ms sum)"
    python3 - "$r" "$step" "$rss" "$step_rss" "$par" "$opt" "$off" "$io" "$wait" <<'PY'
import sys
r, step, rss, step_rss, par, opt, off, io, wait = sys.argv[1:]
mib = lambda v: "-" if v == "-" else f"{float(v) / 2**20:.1f}"
hidden = "-" if io in ("-", "0") else f"{100 * (1 - float(wait) / float(io)):.0f}%"
fmt = lambda v, p: "-" if v == "-" else f"{float(v):.{p}f}"
print(f"{r:<16} {fmt(step, 3):>12} {rss:>14} {mib(step_rss):>14} {mib(par):>12} {mib(opt):>16} {mib(off):>16} {fmt(io, 0):>12} {fmt(wait, 0):>12} {hidden:>10}")
PY
  done
  echo "# io_ms: the I/O threads' pread/pwrite time (reader and writer added), wait_ms: the step blocked on"
  echo "# them (steps 2..$STEPS summed);"
  echo "# hidden = 1 - wait/io. The page cache holds what the file I/O wrote: peak RSS counts the process only."
  echo "# peak_rss: /usr/bin/time's maxrss of the whole run, start-up included (building the model and writing"
  echo "# the offload files set it before step 1); step_rss: the worker's RSS at the end of steps 2..$STEPS (median,"
  echo "# metrics.jsonl rss_bytes), what the steps hold."
} | tee "$OUT"
