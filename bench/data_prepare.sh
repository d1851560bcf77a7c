#!/usr/bin/env bash
# Data pipeline throughput. (1) `dtrain data prepare` on data/corpus.txt's
# paragraphs as JSONL (a byte-level BPE of vocab 8000 trained on it first)
# against the same tokenizer called directly from Python on one core
# (Tokenizer.encode per document, pinned with taskset): MB/s and tokens/s of
# each, side by side, and the ratio. (2) The time a rank spends reading its
# samples (metrics' data_fetch_s, rank 0) against the step time
# (step_time_s) at dp 4 on the prepared data: medians over the steps after
# the first, and their ratio.
# Prepare picks its thread count from the cores the load average leaves
# free (scripts/data_prepare.py); the two sides alternate REPS times.
# Usage: [REPS=3] bench/data_prepare.sh [STEPS]   (DTRAIN_BUILD_DIR, DTRAIN_VENV)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DTRAIN_BUILD_DIR:-$ROOT/build}"
DTRAIN="$BUILD/apps/dtrain/dtrain"
STEPS="${1:-30}"
REPS="${REPS:-3}"
export DTRAIN_VENV="${DTRAIN_VENV:-$HOME/.cache/dtrain/torch-2.15.0}"
PY="$DTRAIN_VENV/bin/python"
[ -x "$DTRAIN" ] || { echo "no $DTRAIN: build first (scripts/build)" >&2; exit 2; }
[ -f "$ROOT/data/corpus.txt" ] || "$ROOT/scripts/make-corpus" >&2
WORK="$(mktemp -d /tmp/dtrain-bench-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$ROOT/data/corpus.txt" "$WORK" <<'PY'
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
corpus, out = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.train([corpus], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>", "<unk>"], show_progress=False))
tok.save(out + "/tok.json")
with open(out + "/docs.jsonl", "w") as f:
    for p in open(corpus, encoding="utf-8", errors="replace").read().split("\n\n"):
        if p.strip():
            f.write(json.dumps({"text": p}) + "\n")
PY

echo "== data prepare vs tokenizers from Python on one core ($(wc -c < "$WORK/docs.jsonl") bytes of JSONL, $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)), $REPS interleaved rounds"
cat > "$WORK/direct.py" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
out = sys.argv[1]
tok = Tokenizer.from_file(out + "/tok.json")
lines = open(out + "/docs.jsonl", "rb").read().splitlines()
t = time.monotonic()
tokens = nbytes = 0
for raw in lines:
    tokens += len(tok.encode(json.loads(raw)["text"]).ids) + 1
    nbytes += len(raw) + 1
s = time.monotonic() - t
print(f"{nbytes / 1e6 / s:.2f} {tokens / s:.0f} {tokens} {s:.2f}")
PY
ratios=()
for rep in $(seq 1 "$REPS"); do  # interleaved: a load drift hits both sides
  rm -f "$WORK"/corpus.*
  summary="$("$DTRAIN" data prepare --tokenizer "$WORK/tok.json" --input "$WORK/docs.jsonl" --output "$WORK/corpus" --append-eod 2>"$WORK/prepare.err")"
  threads="$(grep -o 'tokenizing on [0-9]* thread(s)[^)]*)' "$WORK/prepare.err" || true)"
  echo "round $rep: dtrain data prepare ($threads): $summary"
  prep_tps="$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<< "$summary")"
  direct="$(RAYON_NUM_THREADS=1 taskset -c 0 "$PY" "$WORK/direct.py" "$WORK")"
  read -r d_mbs d_tps d_tokens d_s <<< "$direct"
  echo "round $rep: tokenizers.encode, 1 core:  $d_tokens tokens in $d_s s, $d_mbs MB/s, $d_tps tokens/s (load $(cut -d' ' -f1 /proc/loadavg))"
  ratios+=("$(awk -v a="$prep_tps" -v b="$d_tps" 'BEGIN { printf "%.3f", a / b }')")
done
echo "ratio prepare / direct (tokens/s over the same tokens and bytes) per round: ${ratios[*]}; median $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')x"

echo "== sample fetch vs step time at dp 4 ($STEPS steps, tiny GPT, vocab 8000, seq_len 128, micro_batch 8)"
cat > "$WORK/spec.yaml" <<YAML
job: {name: data-bench, seed: 1}
cluster: {nodes: 1, procs_per_node: 4, device: cpu, backend: gloo}
parallel: {dp: 4}
model: {vocab: 8000, layers: 2, d_model: 64, heads: 4, seq_len: 128, dropout: 0.0}
train: {steps: $STEPS, micro_batch: 8, lr: 1.0e-3, warmup_steps: 2}
data: {path: $WORK/corpus, format: indexed}
log: {dir: $WORK/run, every: 1}
YAML
"$DTRAIN" launch "$WORK/spec.yaml" > "$WORK/launch.log" 2>&1 || { tail -20 "$WORK/launch.log"; exit 1; }
"$PY" - "$WORK/run/metrics.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])][1:]  # the first step warms up
fetch = statistics.median(r["data_fetch_s"] for r in recs)
step = statistics.median(r["step_time_s"] for r in recs)
print(f"median over {len(recs)} steps: sample fetch {fetch * 1e3:.3f} ms, step {step * 1e3:.1f} ms, "
      f"fetch / step = {fetch / step:.4f}")
PY
