#!/usr/bin/env python3
# CPU samples of a pipeline run by phase: reads `perf script --no-inline -F tid,ip,sym` of a record taken
# with --call-graph dwarf, files each sample under the first phase whose pattern one of its frames
# matches (PHASES, in order) and by its leaf (sgemm, copy, malloc, other), and prints % of all samples.
# MKL's sgemm frames carry no unwind tables: their samples land in "other". Not a timeline (profile_phases.py).
#   perf record -F 499 -e cpu-clock --call-graph dwarf,16384 -p <ranks> -o perf.data -- sleep 5
#   perf script -i perf.data --no-inline -F tid,ip,sym > s.txt && pp_perf_phases.py s.txt [PHASE ...]
#   (each PHASE named after the table: its 8 most frequent leaves)
import collections
import re
import sys

PHASES = [("optimizer", "adamw|AdamW|optim::|clip_grad|grad_norm|zero_grad|scale_grads"),
          ("loss/head", "head_loss|head_logits|cross_entropy"),
          ("backward", r"Tensor::_backward|autograd::Engine|run_backward"),
          ("forward blocks", "run_blocks|run_block"), ("embed", "GptImpl::embed"),
          ("p2p rings", "P2pChannel|ShmP2p|P2pWork"), ("gloo", "gloo::|c10d::"),
          ("schedule", "Pipeline::run|pipeline"), ("trainer", "trainer|train_step|run_training")]
LEAVES = ["sgemm", "copy", "malloc", "other"]


def read(path):  # [(tid, [frames, leaf first])]
    samples, cur = [], None
    for line in open(path):
        if not line.strip():
            if cur and cur[1]:
                samples.append(cur)
            cur = None
        elif not line.startswith("\t"):
            cur = (line.split()[0], [])
        elif cur is not None:
            parts = line.strip().split(None, 1)
            cur[1].append(parts[1] if len(parts) > 1 else "?")
    if cur and cur[1]:
        samples.append(cur)
    return samples


def phase(frames):
    return next((name for name, pat in PHASES if any(re.search(pat, f) for f in frames)), "other")


def leaf(sym):
    if "sgemm" in sym:
        return "sgemm"
    if "direct_copy" in sym or "copy_kernel" in sym:
        return "copy"
    return "malloc" if re.search("malloc|free|unlink_chunk|_int_|consolidate", sym) else "other"


def main():
    samples = read(sys.argv[1])
    n = len(samples)
    by, grid = collections.Counter(), collections.Counter()
    for _, frames in samples:
        p = phase(frames)
        by[p] += 1
        grid[(p, leaf(frames[0]))] += 1
    print(f"{n} samples; % of all samples")
    print(f"{'phase':16s} {'all':>6s} " + " ".join(f"{c:>7s}" for c in LEAVES) + "  not sgemm")
    for p, k in by.most_common():
        print(f"{p:16s} {100 * k / n:6.1f} " + " ".join(f"{100 * grid[(p, c)] / n:7.1f}" for c in LEAVES) +
              f"  {100 * (k - grid[(p, 'sgemm')]) / n:9.1f}")
    for want in sys.argv[2:]:
        top = collections.Counter(f[0][:90] for _, f in samples if phase(f) == want)
        print(f"== {want}: most frequent leaves")
        for sym, k in top.most_common(8):
            print(f"  {k:4d} {sym}")


if __name__ == "__main__":
    main()
