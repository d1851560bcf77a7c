#!/usr/bin/env bash
# bf16 vs fp32 on this CPU, on the quickstart (dp 4, 0.87M parameters):
# train.precision fp32, bf16 (autocast, fp32 gradient all-reduce) and bf16
# with parallel.reduce_dtype bf16, STEPS steps each in one session: the loss
# at the last step (bf16 must be within 3% of fp32), the steady tokens/s
# (mean over steps after the first 10%) as a ratio to fp32, and the bytes
# rank 0 sent over dp per step. Notes whether the CPU has avx512_bf16 / AMX.
#   [STEPS=200] bench/bf16.sh -> bench/results/bf16.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-200}"
OUT="${OUT:-$ROOT/bench/results/bf16.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] || { echo "bf16: build dtrain first (scripts/build)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
tmp="$(mktemp -d /tmp/dtrain-bf16-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
run() {  # $1 = name, then --set pairs
  local name="$1"; shift
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml --set train.steps="$STEPS" --set log.every=1 \
    --set log.dir="$tmp/$name" --set checkpoint.dir='""' "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; echo "bf16: $name failed" >&2; exit 1; }
  echo "$name done" >&2
}
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
run fp32 --set train.precision=fp32
run bf16 --set train.precision=bf16
run bf16_reduce_bf16 --set train.precision=bf16 --set parallel.reduce_dtype=bf16
FLAGS="$( (grep -o -w 'avx512_bf16\|amx_bf16\|amx_tile\|avx512f' /proc/cpuinfo || true) | sort -u | tr '\n' ' ')"
"$PY" - "$tmp" "$OUT" "STEPS=$STEPS bench/bf16.sh" "$LOAD0" "$FLAGS" <<'PYEOF'
import json, os, sys, time
tmp, out_path, cmd, load0, flags = sys.argv[1:6]
def load(name):
    return [json.loads(l) for l in open(os.path.join(tmp, name, "metrics.jsonl")) if l.strip()]
runs = {n: load(n) for n in ("fp32", "bf16", "bf16_reduce_bf16")}
def steady_tps(recs):
    skip = max(1, len(recs) // 10)
    xs = [r["tokens_per_s"] for r in recs[skip:] if "tokens_per_s" in r]
    return sum(xs) / len(xs)
lines = []
say = lambda x="": (lines.append(x), print(x))
say(f"# bench/bf16.sh: train.precision bf16 vs fp32 on configs/quickstart.yaml, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# CPU flags of interest: {flags.strip() or 'none of avx512f, avx512_bf16, amx'}; {os.cpu_count()} cores, 4 ranks")
say(f"# load average at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
base = runs["fp32"]
say(f"{'run':<18} {'final_loss':>10} {'vs_fp32':>8} {'tok/s':>10} {'tok/s ratio':>11} {'dp_bytes/step':>13}")
for name, recs in runs.items():
    loss = recs[-1]["loss"]
    rel = loss / base[-1]["loss"] - 1
    tps = steady_tps(recs)
    say(f"{name:<18} {loss:>10.4f} {100 * rel:>+7.2f}% {tps:>10.0f} {tps / steady_tps(base):>11.2f} "
        f"{recs[-1].get('dp_bytes_sent', 0):>13}")
ok = all(abs(r[-1]["loss"] / base[-1]["loss"] - 1) <= 0.03 for r in runs.values())
say(f"# bf16 final losses within 3% of fp32: {'yes' if ok else 'NO'}")
open(out_path, "w").write("\n".join(lines) + "\n")
sys.exit(0 if ok else 1)
PYEOF
