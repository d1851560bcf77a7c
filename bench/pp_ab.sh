#!/usr/bin/env bash
# Two dtrain builds' pipeline runtime side by side (one change's before and
# after): pp PP, M micro-batches, for each of SCHEDS, ROUNDS interleaved
# rounds (A first in odd rounds, B in even ones). Per run: tokens/s and rank
# 0's process CPU ms per step from step 10 (metrics.jsonl), and from a
# timeline trace of steps 21..30, per rank, the ms per step the compute
# thread spent inside send calls and blocked in receives.
# Every rank's process CPU ms per step (steps 20 to STEPS - 10) comes from
# bench/pp_rank_cpu.py, which reads /proc while the job runs.
#   A=/path/to/build_before B=/path/to/build_after [PP=2] [M=4] [ROUNDS=3] [STEPS=40]
#   [SCHEDS="1f1b interleaved"] bench/pp_ab.sh   (prints a table; OUT=file keeps it)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${A:?A=build dir of the before build}" "${B:?B=build dir of the after build}"
PP="${PP:-2}" M="${M:-4}" ROUNDS="${ROUNDS:-3}" STEPS="${STEPS:-40}"  # STEPS >= 30: the trace ends at 30
SCHEDS="${SCHEDS:-1f1b interleaved}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp="$(mktemp -d /tmp/dtrain-pp-ab-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
OUT="${OUT:-$tmp/ab.txt}"

run() {  # $1 = build dir, $2 = schedule, $3 = name; prints one table row's figures
  local sched=1f1b v=1 dir="$tmp/$3"
  [ "$2" = interleaved ] && sched=interleaved_1f1b v=2
  "$1/apps/dtrain/dtrain" launch configs/quickstart.yaml --set parallel.pp="$PP" --set parallel.dp=1 \
    --set cluster.procs_per_node="$PP" --set parallel.pipeline.schedule="$sched" \
    --set parallel.pipeline.virtual_stages="$v" --set train.grad_accum="$M" --set train.steps="$STEPS" \
    --set log.every=10 --set log.dir="$dir" --set checkpoint.dir='""' --set train.lr=1e-3 \
    --set train.micro_batch=8 --set model.seq_len=64 --set train.warmup_steps=20 \
    --set "log.trace.steps=[21, 30]" >"$dir.log" 2>&1 &
  local pid=$!
  # every rank's CPU per step from step 20 to STEPS - 10 (bench/pp_rank_cpu.py)
  local ranks; ranks="$("$PY" "$ROOT/bench/pp_rank_cpu.py" "$pid" "$dir/metrics.jsonl" '"step": (\d+)' 20 $((STEPS - 10)))"
  wait "$pid" || { tail -20 "$dir.log" >&2; echo "pp_ab: $3 failed" >&2; exit 1; }
  echo -n "$ranks "
  "$PY" - "$dir" "$((8 * M * 64))" <<'PYEOF'
import glob, json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip() and "elapsed_s" in l]
first = next(r for r in recs if r["step"] >= 10)
last = recs[-1]
steps = last["step"] - first["step"]
out = [f"{steps * int(sys.argv[2]) / (last['elapsed_s'] - first['elapsed_s']):.1f}",
       f"{1e3 * (last['cpu_s'] - first['cpu_s']) / steps:.2f}"]
sends, recvs = [], []
for f in sorted(glob.glob(sys.argv[1] + "/trace/rank_*.json")):
    j = json.load(open(f))
    n = j["steps"][1] - j["steps"][0] + 1
    sp = j["spans"]
    sends.append(sum(e - b for k, b, e, *_ in sp if k in ("send_act", "send_grad")) / 1e6 / n)
    recvs.append(sum(e - b for k, b, e, *_ in sp if k in ("recv_act", "recv_grad")) / 1e6 / n)
out += ["/".join(f"{x:.1f}" for x in sends), "/".join(f"{x:.1f}" for x in recvs), f"{last['loss']:.6f}"]
print(" ".join(out))
PYEOF
}

{
  echo "# bench/pp_ab.sh: A = $A, B = $B; pp $PP, $M micro-batches, quickstart GPT, $STEPS steps, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); send = ms/step in send calls, recv = ms/step blocked in receives (per rank)"
  echo "| schedule | round | build | tok/s | rank 0 CPU ms/step | CPU ms/step per rank | send ms/step | recv ms/step | loss |"
  echo "|---|---|---|---|---|---|---|---|---|"
} | tee "$OUT"
for k in $(seq "$ROUNDS"); do
  for s in $SCHEDS; do
    order="A B"
    [ $((k % 2)) -eq 0 ] && order="B A"
    for side in $order; do
      dir="$A"
      [ "$side" = B ] && dir="$B"
      read -r ranks tok cpu snd rcv loss <<<"$(run "$dir" "$s" "${side}_${s}_$k")"
      echo "| $s | $k | $side | $tok | $cpu | $ranks | $snd | $rcv | $loss |" | tee -a "$OUT"
    done
  done
done
"$PY" - "$OUT" <<'PYEOF' | tee -a "$OUT"
import collections, statistics, sys
rows = [l.split("|")[1:-1] for l in open(sys.argv[1]) if l.startswith("| ") and l.split("|")[3].strip() in ("A", "B")]
by = collections.defaultdict(lambda: collections.defaultdict(dict))
for r in rows:
    ranks = [float(x) for x in r[5].split("/")] if r[5].strip() != "na" else []
    by[r[0].strip()][r[1].strip()][r[2].strip()] = (float(r[3]), float(r[4]), ranks)
for s, rounds in by.items():
    pairs = [v for v in rounds.values() if "A" in v and "B" in v]
    tok = statistics.median(v["B"][0] / v["A"][0] for v in pairs)
    cpu = statistics.median(v["A"][1] / v["B"][1] for v in pairs)
    full = [v for v in pairs if v["A"][2] and len(v["A"][2]) == len(v["B"][2])]
    per = "/".join(f"{statistics.median(v['A'][2][i] / v['B'][2][i] for v in full):.3f}"
                   for i in range(len(full[0]["A"][2]))) if full else "na"
    print(f"# {s}: median B / A tokens/s {tok:.3f}, A / B rank 0 CPU per step {cpu:.3f}, "
          f"A / B CPU per step per rank {per}, {len(pairs)} rounds")
PYEOF
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
