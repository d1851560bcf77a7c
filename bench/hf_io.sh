#!/usr/bin/env bash
# Hugging Face import/export at scale: a random ~1B-parameter Llama written by
# transformers (bf16, in a temporary directory deleted after), then
# `dtrain ckpt import-hf` (bf16 -> fp32 checkpoint) and `dtrain ckpt export-hf`
# (fp32 and --dtype bf16), each under /usr/bin/time -v: wall time and peak
# RSS, the RSS also as a ratio to the model's bytes (bf16 file, fp32
# checkpoint). Goal: peak RSS below 1.2x the model's bytes (import and export
# stream one tensor at a time, so it is far below). Run it niced on a shared
# machine; needs ~12 GB of disk in TMPDIR.
#   [LAYERS=20] bench/hf_io.sh -> bench/results/hf_io.txt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
LAYERS="${LAYERS:-20}"
OUT="${OUT:-$ROOT/bench/results/hf_io.txt}"
PY="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}/bin/python"
D="$BUILD/apps/dtrain/dtrain"
[ -x "$D" ] || { echo "hf_io: build dtrain first (scripts/build)" >&2; exit 2; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/dtrain-hfio-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export HF_HUB_OFFLINE=1
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s)
"$PY" - "$tmp/hf" "$LAYERS" <<'PYEOF'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=int(sys.argv[2]),
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)
torch.set_default_dtype(torch.bfloat16)  # never an fp32 copy: 2 bytes a parameter
model = LlamaForCausalLM(cfg)
print(f"parameters {sum(p.numel() for p in model.parameters())}", file=sys.stderr)
model.save_pretrained(sys.argv[1])
PYEOF
echo "model written in $(( $(date +%s) - t0 )) s" >&2
# measure NAME CMD...: wall seconds and peak RSS (kB) of CMD
measure() {
  local name="$1"; shift
  /usr/bin/time -v "$@" >"$tmp/$name.out" 2>"$tmp/$name.time" || { cat "$tmp/$name.out" "$tmp/$name.time" >&2; exit 1; }
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$tmp/$name.time" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$tmp/$name.time" | awk '{print $NF}')
  echo "$name $wall $rss"
}
bytes_of() { du -sb "$1" | cut -f1; }
R1=$(measure import nice -n 10 "$D" ckpt import-hf "$tmp/hf" "$tmp/ck")
R2=$(measure export_fp32 nice -n 10 "$D" ckpt export-hf "$tmp/ck" "$tmp/out32")
R3=$(measure export_bf16 nice -n 10 "$D" ckpt export-hf "$tmp/ck" "$tmp/out16" --dtype bf16)
HF=$(bytes_of "$tmp/hf"); CK=$(bytes_of "$tmp/ck/step_0"); E32=$(bytes_of "$tmp/out32"); E16=$(bytes_of "$tmp/out16")
{
  echo "# bench/hf_io.sh (LAYERS=$LAYERS) $(date -u +%Y-%m-%dT%H:%MZ), load before: $LOAD0, $(nproc) cores"
  echo "# random Llama: vocab 32000, hidden 2048, ${LAYERS} layers, 32 heads, 8 kv heads, ffn 5632"
  echo "# bytes: HF bf16 $HF, checkpoint fp32 $CK, export fp32 $E32, export bf16 $E16"
  printf "%-12s %10s %12s %14s %14s\n" step wall peak_rss_MB "rss/bf16_model" "rss/fp32_model"
  for r in "$R1" "$R2" "$R3"; do
    set -- $r
    awk -v n="$1" -v w="$2" -v k="$3" -v hf="$HF" -v ck="$CK" \
      'BEGIN { printf "%-12s %10s %12.1f %14.3f %14.3f\n", n, w, k / 1024, k * 1024 / hf, k * 1024 / ck }'
  done
} | tee "$OUT"
