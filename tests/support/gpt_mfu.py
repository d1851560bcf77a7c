#!/usr/bin/env python3
# gpt_mfu.py: throughput and model FLOPs utilisation of a GPT or llama run,
# from the resolved spec (`dtrain validate SPEC --format json`) and the run's
# metrics.jsonl. Counts the parameters as the engine lays them out (a GPT:
# engine/model/gpt.cpp; a llama: the Llama parameter table), FLOPs per token
# as 6 N + 12 L C T (PaLM's count: forward + backward, with attention's
# T x T products; for a llama N is the matrices a token multiplies: the
# blocks' (a MoE block's router and top_k experts) and the head's, not the
# embedding lookup, as `dtrain plan`'s flops_per_token), and leaves out the
# first logged interval (CUDA start-up, allocator warm-up). Standard library
# only.
# Exit 0 when the run logged its last step with finite losses, 1 otherwise.
#
#   gpt_mfu.py --spec spec.json --metrics RUN/metrics.jsonl
#       [--peak-tflops 989] [--measured-tflops 790] [--gpu-mem FILE]
import argparse
import json
import math
import sys


def gpt_params(m):
    """Parameters of engine/model/gpt.cpp: wte [V, C], wpe [T, C], per block
    ln1 (2C), qkv (3C^2 + 3C), attn proj (C^2 + C), ln2 (2C), fc (4C^2 + 4C),
    mlp proj (4C^2 + C) = 12C^2 + 13C, final LayerNorm (2C), head [V, C] untied."""
    V, C, T, L = m["vocab"], m["d_model"], m["seq_len"], m["layers"]
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C


def llama_counts(m):
    """(parameters, matmul weights a token meets) of a llama: wte [V, C], per
    block 2 RMSNorms (2C), q and proj (2C^2), kv (2 KV D C), a SwiGLU MLP
    (3CF) or, in a MoE block, a router (EC) and E experts of 3C Fe; ln_f (C);
    head [V, C] unless tied. No biases, no position table."""
    V, C, L, H = m["vocab"], m["d_model"], m["layers"], m["heads"]
    KV = m.get("kv_heads") or H
    F = m.get("ffn_hidden") or 4 * C
    D = C // H
    moe = m.get("moe", {})
    E, K, every = moe.get("experts", 0), moe.get("top_k", 1), max(1, moe.get("every", 1))
    Fe = moe.get("d_ff") or 4 * C
    attention = 2 * C * C + 2 * KV * D * C
    params, matmul = V * C * (1 if m.get("tie_embeddings") else 2) + C, V * C
    for layer in range(L):
        params += 2 * C + attention
        matmul += attention
        if E > 0 and layer % every == 0:
            params += E * C + E * 3 * C * Fe
            matmul += E * C + K * 3 * C * Fe
        else:
            params += 3 * C * F
            matmul += 3 * C * F
    return params, matmul


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True, help="output of dtrain validate SPEC --format json")
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM datasheet)")
    ap.add_argument("--measured-tflops", type=float, default=790.0, help="a measured bf16 GEMM rate on the machine")
    ap.add_argument("--gpu-mem", help="nvidia-smi memory.used samples (MiB, one a line)")
    args = ap.parse_args()

    try:
        with open(args.spec) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpt_mfu: FAIL: {args.spec}: {e}")
        return 1
    spec, derived = doc["spec"], doc["derived"]
    m = spec["model"]
    kind = m.get("kind", "gpt")
    if kind == "llama":
        n, n_matmul = llama_counts(m)
    else:
        n = n_matmul = gpt_params(m)
    flops_per_token = 6 * n_matmul + 12 * m["layers"] * m["d_model"] * m["seq_len"]
    tokens_per_step = derived["tokens_per_step"]
    steps = spec["train"]["steps"]

    recs = []
    try:
        with open(args.metrics) as f:
            for line in f:
                if line.strip():
                    recs.append(json.loads(line))
    except OSError as e:
        print(f"gpt_mfu: FAIL: {args.metrics}: {e.strerror} (the run logged no metrics)")
        return 1
    print(f"model {kind}: d_model {m['d_model']}, layers {m['layers']}, heads {m['heads']}, seq_len {m['seq_len']}, "
          f"vocab {m['vocab']}: N = {n:,} parameters ({n / 1e9:.3f} B), {n_matmul:,} in a token's matmuls")
    print(f"flops/token = 6N + 12*L*C*T = {flops_per_token:.4e}; tokens/step = {tokens_per_step} "
          f"(micro_batch {spec['train']['micro_batch']} x grad_accum {spec['train']['grad_accum']} "
          f"x dp {spec['parallel']['dp']} x seq {m['seq_len']}), precision {spec['train']['precision']}")
    for r in recs:
        print(f"  step {r['step']:>4}  loss {r['loss']:.4f}  {r['tokens_per_s']:>10.0f} tok/s  "
              f"{r['step_time_s'] * 1e3:8.1f} ms/step")

    problems = []
    if not recs or recs[-1]["step"] != steps:
        problems.append(f"the run did not log its last step {steps} (last logged: "
                        f"{recs[-1]['step'] if recs else 'none'})")
    if any(not math.isfinite(r["loss"]) for r in recs):
        problems.append("a loss is not finite")
    # Intervals after the first logged one, each weighted by the steps it covers.
    timed = [(b["step"] - a["step"], b["step_time_s"]) for a, b in zip(recs, recs[1:])]
    if len(timed) < 2:
        problems.append(f"only {len(timed)} timed interval(s) after the first log")
    tokens_per_s = 0.0
    if timed:
        steps_timed = sum(k for k, _ in timed)
        seconds = sum(k * t for k, t in timed)
        tokens_per_s = steps_timed * tokens_per_step / seconds if seconds > 0 else 0.0
    achieved = tokens_per_s * flops_per_token
    mfu = achieved / (args.peak_tflops * 1e12)
    vs_measured = achieved / (args.measured_tflops * 1e12)
    if timed and not (0 < mfu < 1.0):
        problems.append(f"MFU {mfu:.1%} is outside (0, 100%): timing or FLOP count is wrong")

    print(f"tokens/s {tokens_per_s:,.0f} (steps {recs[0]['step'] + 1 if recs else '?'}..{steps}; "
          f"the first logged interval left out); {achieved / 1e12:.2f} TFLOP/s achieved")
    print(f"MFU {mfu:.1%} of {args.peak_tflops:g} TFLOP/s (bf16 dense peak); "
          f"{vs_measured:.1%} of the measured {args.measured_tflops:g} TFLOP/s")
    last = recs[-1] if recs else {}
    if last:
        gib = 1 << 30
        print(f"memory (rank 0): params {last['param_bytes'] / gib:.1f} GiB, grads {last['grad_bytes'] / gib:.1f} GiB, "
              f"optimizer {last['optimizer_bytes'] / gib:.1f} GiB, host rss {last['rss_bytes'] / gib:.1f} GiB")
        print(f"loss: step {recs[0]['step']} {recs[0]['loss']:.4f} -> step {last['step']} {last['loss']:.4f}")
    peak_mem = ""
    if args.gpu_mem:
        try:
            with open(args.gpu_mem) as f:
                samples = [float(x) for x in f.read().split() if x.replace(".", "", 1).isdigit()]
            if samples:
                peak_mem = f", peak GPU memory {max(samples) / 1024:.1f} GiB"
                print(f"GPU memory used (nvidia-smi, {len(samples)} samples): peak {max(samples) / 1024:.1f} GiB")
        except OSError:
            pass

    for p in problems:
        print(f"problem: {p}")
    ok = not problems
    print(f"gpt_mfu: {'PASS' if ok else 'FAIL'}: {tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%} of "
          f"{args.peak_tflops:g} TFLOP/s ({vs_measured:.1%} of measured {args.measured_tflops:g}), "
          f"N {n / 1e9:.3f} B, {flops_per_token:.3e} FLOP/token{peak_mem}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
