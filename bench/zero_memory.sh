#!/usr/bin/env bash
# ZeRO memory per rank: persistent bytes (parameters + gradients + AdamW
# moments, as the rank holds them) and peak live tensor bytes, for
# parallel.zero 0/1/2/3 at dp 1, 2, 4, from each run's <log.dir>/memory.tsv,
# next to the fp32-Adam formulas of the ZeRO paper (P parameters, N = dp):
#   zero 0: 16P   zero 1: 8P + 8P/N   zero 2: 4P + 12P/N   zero 3: 16P/N
# The engine pads each unit's flat buffer to a multiple of N, so a measured
# value may exceed its formula by the padding (measured/formula >= 1).
# Peak counts activations too: it has no formula and is shown as measured.
#   [STEPS=4] [DPS="1 2 4"] [D_MODEL=128 HEADS=4 LAYERS=4 SEQ=64 MB=4] bench/zero_memory.sh
#     -> bench/results/zero_memory.txt, bench/results/zero_memory.svg
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
STEPS="${STEPS:-4}"
DPS="${DPS:-1 2 4}"
LAYERS="${LAYERS:-4}" D_MODEL="${D_MODEL:-128}" HEADS="${HEADS:-4}" SEQ="${SEQ:-64}" MB="${MB:-4}"
OUT="${OUT:-$ROOT/bench/results/zero_memory.txt}"
SVG="${SVG:-${OUT%.txt}.svg}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
cd "$ROOT"
[ -x "$BUILD/apps/dtrain/dtrain" ] && [ -x "$BUILD/apps/dtrain/dtrain-worker" ] || {
  echo "zero_memory: build dtrain first (scripts/build, or DTRAIN_BUILD_DIR=...)" >&2; exit 2; }
[ -x "$PY" ] || { echo "zero_memory: no $PY (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

tmp="$(mktemp -d /tmp/dtrain-zero-memory-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

run() {  # $1 = zero stage, $2 = dp
  local dir="$tmp/z$1-dp$2"
  "$BUILD/apps/dtrain/dtrain" launch configs/quickstart.yaml \
    --set parallel.zero="$1" --set parallel.dp="$2" --set cluster.procs_per_node="$2" \
    --set model.layers="$LAYERS" --set model.d_model="$D_MODEL" --set model.heads="$HEADS" \
    --set model.seq_len="$SEQ" --set train.micro_batch="$MB" --set train.steps="$STEPS" \
    --set train.warmup_steps=1 --set log.every=1 --set log.dir="$dir" --set checkpoint.dir='""' \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; echo "zero_memory: zero $1 dp $2 failed" >&2; exit 1; }
}

LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
for dp in $DPS; do
  for z in 0 1 2 3; do
    run "$z" "$dp"
    echo "zero $z dp $dp done" >&2
  done
done

CMD="STEPS=$STEPS DPS=\"$DPS\" LAYERS=$LAYERS D_MODEL=$D_MODEL HEADS=$HEADS SEQ=$SEQ MB=$MB bench/zero_memory.sh"
"$PY" - "$tmp" "$DPS" "$OUT" "$SVG" "$CMD" "$LOAD0" "$LAYERS $D_MODEL $HEADS $SEQ $MB $STEPS" <<'EOF'
import math, os, re, sys, time
tmp, dps, out_path, svg_path, cmd, load0, sizes = sys.argv[1:8]
dps = [int(d) for d in dps.split()]
layers, d_model, heads, seq, mb, steps = (int(x) for x in sizes.split())
STAGES = [0, 1, 2, 3]
MIB = 1024.0 * 1024.0

def formula(z, P, n):  # bytes per rank, fp32 params and grads, two fp32 AdamW moments
    return {0: 16 * P, 1: 8 * P + 8 * P / n, 2: 4 * P + 12 * P / n, 3: 16 * P / n}[z]

runs, P = {}, None
for n in dps:
    for z in STAGES:
        d = os.path.join(tmp, f"z{z}-dp{n}")
        log = open(d + ".log").read()
        p = int(re.search(r"model gpt: (\d+) parameters", log).group(1))
        if P is not None and p != P:
            sys.exit(f"zero_memory: P differs between runs ({P} vs {p})")
        P = p
        pad = re.search(r"\((\d+) \+ (\d+) padding elements\)", log)
        rows = [l.split("\t") for l in open(os.path.join(d, "memory.tsv")).read().splitlines()[1:]]
        ranks = [dict(rank=int(r[0]), params=int(r[1]), grads=int(r[2]), optim=int(r[3]),
                      peak=int(r[4]), rss=int(r[5])) for r in rows]
        if len(ranks) != n:
            sys.exit(f"zero_memory: {d}/memory.tsv has {len(ranks)} ranks, expected {n}")
        for r in ranks:
            r["persistent"] = r["params"] + r["grads"] + r["optim"]
        runs[z, n] = dict(ranks=ranks, padding=int(pad.group(2)) if pad else 0)

lines = []
def say(s=""):
    lines.append(s)
    print(s)

say(f"# bench/zero_memory.sh: ZeRO persistent and peak bytes per rank, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
say(f"# GPT layers {layers} d_model {d_model} heads {heads} seq_len {seq} vocab 256, P = {P} parameters; "
    f"micro_batch {mb}, {steps} steps, gloo on {os.cpu_count()} cores")
say(f"# load average (1/5/15 min) at start: {load0}, at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
say("# from each run's memory.tsv (every rank); persistent = param + grad + optimizer bytes; the columns")
say("# are rank 0's (the largest: padding sits at the end of the last rank's shard, and AdamW keeps no")
say("# moments for padding), spread = max - min of persistent over ranks; peak = the largest")
say("# peak_bytes (live CPU tensor bytes within a step) over ranks and steps, peak-pers what the step adds")
say("# on top of the persistent bytes (activations, gathered units, buffers); pad = padding elements")
say("# formula: zero 0 16P, zero 1 8P + 8P/N, zero 2 4P + 12P/N, zero 3 16P/N (fp32 params and grads, AdamW m and v);")
say("# form(P+pad): the same with the padded size, which rank 0 should match exactly")
say(f"# reproduce: {cmd}")
hdr = (f"{'zero':>4} {'dp':>3} {'param_B':>10} {'grad_B':>10} {'optim_B':>10} {'persistent_B':>13} "
       f"{'formula_B':>12} {'meas/form':>9} {'pad':>4} {'form(P+pad)':>11} {'spread_B':>8} {'peak_B':>11} {'peak-pers_B':>11}")
say(hdr)
for n in dps:
    for z in STAGES:
        run = runs[z, n]
        r0 = run["ranks"][0]
        f = formula(z, P, n)
        pers = [r["persistent"] for r in run["ranks"]]
        peak = max(r["peak"] for r in run["ranks"])
        say(f"{z:>4} {n:>3} {r0['params']:>10} {r0['grads']:>10} {r0['optim']:>10} {r0['persistent']:>13} "
            f"{f:>12.0f} {r0['persistent'] / f:>9.6f} {run['padding']:>4} {formula(z, P + run['padding'], n):>11.0f} "
            f"{max(pers) - min(pers):>8} "
            f"{peak:>11} {peak - r0['persistent']:>11}")
say()
say("# persistent MiB per rank (measured / formula)")
say(f"{'zero':>4} " + " ".join(f"{'dp ' + str(n):>19}" for n in dps))
for z in STAGES:
    cells = []
    for n in dps:
        m = runs[z, n]["ranks"][0]["persistent"]
        cells.append(f"{m / MIB:8.3f} / {formula(z, P, n) / MIB:8.3f}")
    say(f"{z:>4} " + " ".join(f"{c:>19}" for c in cells))
exact = all(runs[z, n]["ranks"][0]["persistent"] == formula(z, P + runs[z, n]["padding"], n)
            for z in STAGES for n in dps)
say(f"rank 0 equals form(P+pad) in every run: {'yes' if exact else 'NO'}")
worst = max(abs(runs[z, n]["ranks"][0]["persistent"] / formula(z, P, n) - 1) for z in STAGES for n in dps)
say(f"largest |measured/formula - 1|: {worst:.2e}")
if any(max(r["persistent"] for r in runs[z, n]["ranks"]) != runs[z, n]["ranks"][0]["persistent"]
       for z in STAGES for n in dps):
    say("WARNING: some rank holds more persistent bytes than rank 0")
open(out_path, "w").write("\n".join(lines) + "\n")

# The plot: persistent MiB per rank vs dp (log2 axis), measured points and formula curves.
W, H, L, R, T, B = 720, 440, 80, 190, 40, 50
pw, ph = W - L - R, H - T - B
colors = {0: "#1f77b4", 1: "#d62728", 2: "#2ca02c", 3: "#ff7f0e"}
lo2, hi2 = math.log2(min(dps)), math.log2(max(dps))
if hi2 == lo2:
    hi2 = lo2 + 1
ymax = max(16 * P, max(r["persistent"] for run in runs.values() for r in run["ranks"])) / MIB
step = [s for s in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if s * 8 >= ymax][0]
ytop = math.ceil(ymax / step) * step
px = lambda n: L + (math.log2(n) - lo2) / (hi2 - lo2) * pw
py = lambda y: T + ph - y / ytop * ph
s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
     f'<rect width="{W}" height="{H}" fill="white"/>',
     f'<text x="{L + pw / 2}" y="22" text-anchor="middle" font-size="15">ZeRO persistent bytes per rank, '
     f'P = {P} (GPT {layers}x{d_model})</text>']
y = 0.0
while y <= ytop + 1e-9:
    s.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{L + pw}" y2="{py(y):.1f}" stroke="#eee"/>')
    s.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    y += step
for n in dps:
    s.append(f'<line x1="{px(n):.1f}" y1="{T}" x2="{px(n):.1f}" y2="{T + ph}" stroke="#eee"/>')
    s.append(f'<text x="{px(n):.1f}" y="{T + ph + 18}" text-anchor="middle">{n}</text>')
s.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
s.append(f'<text x="{L + pw / 2}" y="{H - 10}" text-anchor="middle">dp (log scale)</text>')
s.append(f'<text x="18" y="{T + ph / 2}" text-anchor="middle" transform="rotate(-90 18 {T + ph / 2})">'
         f'persistent MiB per rank (params + grads + AdamW)</text>')
for i, z in enumerate(STAGES):
    c = colors[z]
    curve = []
    for k in range(41):  # the formula as a continuous curve in N
        n = 2 ** (lo2 + (hi2 - lo2) * k / 40)
        curve.append(f"{px(n):.1f},{py(formula(z, P, n) / MIB):.1f}")
    s.append(f'<polyline points="{" ".join(curve)}" fill="none" stroke="{c}" stroke-width="1.5" stroke-dasharray="5,4"/>')
    meas = [(n, runs[z, n]["ranks"][0]["persistent"] / MIB) for n in dps]
    s.append(f'<polyline points="{" ".join(f"{px(n):.1f},{py(m):.1f}" for n, m in meas)}" fill="none" '
             f'stroke="{c}" stroke-width="1" stroke-opacity="0.5"/>')
    for n, m in meas:
        # Equal values (every stage at dp 1) overlap: concentric, smaller for later stages.
        s.append(f'<circle cx="{px(n):.1f}" cy="{py(m):.1f}" r="{7 - 1.5 * i}" fill="{c}"><title>zero {z} dp {n}: '
                 f'{m:.3f} MiB (formula {formula(z, P, n) / MIB:.3f})</title></circle>')
    ly = T + 16 + 20 * i
    s.append(f'<circle cx="{L + pw + 20}" cy="{ly - 4}" r="{7 - 1.5 * i}" fill="{c}"/>')
    s.append(f'<line x1="{L + pw + 30}" y1="{ly - 4}" x2="{L + pw + 50}" y2="{ly - 4}" stroke="{c}" stroke-dasharray="5,4"/>')
    s.append(f'<text x="{L + pw + 56}" y="{ly}">zero {z}{" (DDP)" if z == 0 else ""}</text>')
ly = T + 16 + 20 * len(STAGES) + 10
s.append(f'<text x="{L + pw + 14}" y="{ly}" font-size="11">dots: measured</text>')
s.append(f'<text x="{L + pw + 14}" y="{ly + 15}" font-size="11">dashed: formula</text>')
s.append("</svg>")
open(svg_path, "w").write("\n".join(s) + "\n")
print(f"wrote {out_path} and {svg_path}")
EOF
