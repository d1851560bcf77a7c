#!/usr/bin/env bash
# Short runs of the Python peers in bench/peer/ on CPU with gloo under the
# venv's torchrun: DDP (gpt_ddp.py), FSDP2 / ZeRO-3 (gpt_fsdp.py) and
# pipelining with Schedule1F1B (gpt_pp.py), each at 2 and 4 ranks, quickstart
# GPT sizes, one thread per rank. A smoke test and a first look, not a
# benchmark: no interleaving, no repetitions. Every run writes its command
# line and its PEER summary line (or its failure's last lines) to OUT. At one
# rank count all three see the same samples per step (the pipeline's
# micro-batches = ranks), so their final losses should agree; the last line
# says by how much they differ.
#   [STEPS=30] [RANKS="2 4"] [DTRAIN_VENV=...] bench/peers_short.sh  -> bench/results/peers_torch215.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}"
PY="$VENV/bin/python"
STEPS="${STEPS:-30}"
RANKS="${RANKS:-2 4}"
OUT="${OUT:-$ROOT/bench/results/peers_torch215.txt}"
cd "$ROOT"
"$PY" -c 'import torch.distributed.run' 2>/dev/null || {
  echo "peers_short: $PY cannot import torch.distributed.run (run scripts/install-deps, or set DTRAIN_VENV)" >&2; exit 2; }
[ -f data/corpus.txt ] || scripts/make-corpus
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

ARGS="--data data/corpus.txt --layers 4 --d-model 128 --heads 4 --seq-len 64 --micro-batch 8"
ARGS="$ARGS --steps $STEPS --lr 1e-3 --warmup-steps 20 --log-every 10"
tmp="$(mktemp -d /tmp/dtrain-peers-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

{
  echo "# bench/peers_short.sh: Python peers on CPU/gloo, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# torch $("$PY" -c 'import torch; print(torch.__version__)') ($VENV), $(nproc --all) cores," \
       "load average at start $(cut -d' ' -f1-3 /proc/loadavg); OMP/MKL/OPENBLAS threads 1"
  echo "# GPT layers 4 d_model 128 heads 4 seq_len 64, micro_batch 8; $STEPS steps, timed from step 10"
} > "$tmp/out"

for n in $RANKS; do
  for peer in gpt_ddp gpt_fsdp gpt_pp; do
    extra=""
    [ "$peer" = gpt_ddp ] && extra="--bucket-mb 1"
    cmd="$PY -m torch.distributed.run --standalone --nproc-per-node $n bench/peer/$peer.py $ARGS $extra"
    echo "peers_short: $peer at $n ranks" >&2
    echo "\$ ${cmd/#$HOME/\~}" >> "$tmp/out"
    if $cmd > "$tmp/log" 2>&1; then
      grep 'PEER kind=' "$tmp/log" | tail -1 >> "$tmp/out"
    else
      echo "FAILED (exit $?): last lines:" >> "$tmp/out"
      grep -v '^\s*$' "$tmp/log" | tail -15 | sed 's/^/  | /' >> "$tmp/out"
    fi
  done
done

"$PY" - "$tmp/out" <<'EOF' >> "$tmp/out"
import sys
by_ranks = {}
for line in open(sys.argv[1]):
    if line.startswith("PEER "):
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        by_ranks.setdefault(f["ranks"], {})[f["kind"]] = float(f["final_loss"])
for r, losses in sorted(by_ranks.items()):
    vals = list(losses.values())
    print(f"# {r} ranks: final_loss " + ", ".join(f"{k} {v:.6f}" for k, v in losses.items())
          + f"; max difference {max(vals) - min(vals):.1e} (printed to 6 decimals)")
EOF
cp "$tmp/out" "$OUT"
cat "$OUT"
