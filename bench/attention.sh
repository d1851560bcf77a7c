#!/usr/bin/env bash
# Tiled (FlashAttention) vs naive attention core on this CPU: one forward +
# backward of [B*H, T, D] q, k, v (dtrain-worker bench-attention), best of
# ITERS after a warm-up, and the peak live bytes the core adds (counting
# allocator), at T = 256, 1024, 4096. Ratios are tiled / naive in the same run.
#   [SEQS="256 1024 4096"] [BATCH=1 HEADS=4 HEAD_DIM=32 ITERS=3 DROPOUT=0] bench/attention.sh
#     -> bench/results/attention.txt, bench/results/attention.svg
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
SEQS="${SEQS:-256 1024 4096}"
BATCH="${BATCH:-1}" HEADS="${HEADS:-4}" HEAD_DIM="${HEAD_DIM:-32}" ITERS="${ITERS:-3}" DROPOUT="${DROPOUT:-0}"
OUT="${OUT:-$ROOT/bench/results/attention.txt}"
SVG="${SVG:-${OUT%.txt}.svg}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
W="$BUILD/apps/dtrain/dtrain-worker"
[ -x "$W" ] || { echo "attention: build dtrain first (scripts/build)" >&2; exit 2; }
[ -x "$PY" ] || { echo "attention: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell
tmp="$(mktemp -d /tmp/dtrain-attention-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for T in $SEQS; do
  for kind in naive tiled; do
    "$W" bench-attention --kind "$kind" --seq "$T" --batch "$BATCH" --heads "$HEADS" --head-dim "$HEAD_DIM" \
      --iters "$ITERS" --dropout "$DROPOUT" >>"$tmp/results.txt"
    echo "$kind T=$T done" >&2
  done
done
CMD="SEQS=\"$SEQS\" BATCH=$BATCH HEADS=$HEADS HEAD_DIM=$HEAD_DIM ITERS=$ITERS DROPOUT=$DROPOUT bench/attention.sh"
"$PY" - "$tmp/results.txt" "$OUT" "$SVG" "$CMD" "$LOAD0" <<'PYEOF'
import os, sys, time
res_path, out_path, svg_path, cmd, load0 = sys.argv[1:6]
rows = [dict(kv.split("=", 1) for kv in l.split()) for l in open(res_path) if l.strip()]
by = {(r["kind"], int(r["seq"])): r for r in rows}
seqs = sorted({int(r["seq"]) for r in rows})
lines = []
say = lambda x="": (lines.append(x), print(x))
r0 = rows[0]
say(f"# bench/attention.sh: attention core forward + backward, naive vs tiled, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# [B*H, T, D] = [{r0['batch']}*{r0['heads']}, T, {r0['head_dim']}] fp32, causal, dropout {r0['dropout']}, "
    f"1 thread, best of {r0['iters']} after a warm-up; peak = live bytes the core adds (counting allocator)")
say(f"# load average at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say(f"# reproduce: {cmd}")
say(f"{'T':>6} {'naive_s':>10} {'tiled_s':>10} {'tiled/naive':>11} {'naive_peak_B':>13} {'tiled_peak_B':>13} {'peak ratio':>10}")
for T in seqs:
    n, t = by[("naive", T)], by[("tiled", T)]
    ns, ts, npk, tpk = float(n["best_s"]), float(t["best_s"]), int(n["peak_bytes"]), int(t["peak_bytes"])
    say(f"{T:>6} {ns:>10.4f} {ts:>10.4f} {ts / ns:>11.2f} {npk:>13} {tpk:>13} {tpk / npk:>10.3f}")
open(out_path, "w").write("\n".join(lines) + "\n")
# SVG: peak bytes (MiB) vs T on log axes, one polyline per kind.
import math
W, H, M = 520, 320, 50
xs = [math.log2(T) for T in seqs]
ys = [math.log2(max(1, int(by[(k, T)]["peak_bytes"]))) for k in ("naive", "tiled") for T in seqs]
def px(x): return M + (x - min(xs)) / max(1e-9, max(xs) - min(xs)) * (W - 2 * M)
def py(y): return H - M - (y - min(ys)) / max(1e-9, max(ys) - min(ys)) * (H - 2 * M)
parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">',
         f'<text x="{M}" y="20" font-size="13">attention core peak bytes vs T (log2 axes): naive (red), tiled (blue)</text>']
for kind, color in (("naive", "red"), ("tiled", "blue")):
    pts = " ".join(f"{px(math.log2(T)):.1f},{py(math.log2(max(1, int(by[(kind, T)]['peak_bytes'])))):.1f}" for T in seqs)
    parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
    for T in seqs:
        b = int(by[(kind, T)]["peak_bytes"])
        parts.append(f'<text x="{px(math.log2(T)) + 4:.1f}" y="{py(math.log2(max(1, b))) - 4:.1f}" font-size="10">{b / 2**20:.1f} MiB</text>')
for T in seqs:
    parts.append(f'<text x="{px(math.log2(T)) - 10:.1f}" y="{H - M + 18}" font-size="11">T={T}</text>')
parts.append("</svg>")
open(svg_path, "w").write("\n".join(parts) + "\n")
PYEOF
