#!/usr/bin/env python3
# The highest MFU a step could show if it did nothing but its GEMMs: the
# compute-bound GPT's (bench/mfu.sh's size) forward and backward GEMMs, timed
# alone at one thread, against the matmul peak that dtrain's workers measure
# at start-up (engine/doctor/engine_facts.cpp measure_gemm_gflops: 512 x 512
# fp32 mm, the best of 3 windows of 20 ms thread CPU time). MFU's numerator is
# the model's FLOP count (engine/trainer/mfu.cpp: 6 N T + 12 L d s T), so
#   ceiling = (model FLOPs / the GEMMs' CPU time) / peak
# is what a step with free norms, GELU, softmax, optimizer, copies and
# communication, and no waiting, would show. RANKS processes run at once,
# one per core, as the ranks do. Each round measures the peak as the worker
# does, the same 512 x 512 product sustained (median of 20 ms windows over
# SUSTAIN s), and one step's GEMMs REPS times; per round and process:
# ceiling vs the best-window peak and vs the sustained rate.
#   $VENV/bin/python bench/mfu_ceiling.py [--ranks 2] [--rounds 5] [--reps 3] [--out F]
# GEMMs of one step per layer (tokens M = micro_batch x seq, heads H, head dim
# hd): qkv, attention output, fc, proj: forward, input grad, weight grad;
# attention: Q K^T and P V forward, dP, dV, dQ, dK backward (batched over
# micro_batch x heads); the untied LM head (vocab 256): forward, dX, dW.
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZE = dict(layers=4, d_model=512, heads=8, seq=128, micro_batch=4, vocab=256)


def worker(a):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    L, D, H, T, B, V = (SIZE[k] for k in ("layers", "d_model", "heads", "seq", "micro_batch", "vocab"))
    M, hd = B * T, D // H
    clock = time.thread_time

    def probe(n=512, seconds=0.06, windows=3):
        x, y = torch.randn(n, n), torch.randn(n, n)
        c = torch.mm(x, y)
        rates = []
        for _ in range(windows):
            reps, t0 = 0, clock()
            t = t0
            while t - t0 < seconds / windows or reps == 0:
                torch.mm(x, y, out=c)
                reps += 1
                t = clock()
            rates.append(2.0 * n ** 3 * reps / (t - t0) / 1e9)
        return rates

    lin = [(D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)]
    ws = [[torch.randn(o, i) for i, o in lin] for _ in range(L)]
    xs = [[torch.randn(M, i) for i, _ in lin] for _ in range(L)]
    dys = [[torch.randn(M, o) for _, o in lin] for _ in range(L)]
    head_w, head_x, head_dy = torch.randn(V, D), torch.randn(M, D), torch.randn(M, V)
    q, k, v = (torch.randn(B * H, T, hd) for _ in range(3))
    p, ds = torch.randn(B * H, T, T), torch.randn(B * H, T, T)  # probabilities, score grads
    do = torch.randn(B * H, T, hd)  # output grad

    def step():
        fl = 0.0
        for layer in range(L):
            for (i, o), w, x, dy in zip(lin, ws[layer], xs[layer], dys[layer]):
                torch.mm(x, w.t())   # forward
                torch.mm(dy, w)      # input grad
                torch.mm(dy.t(), x)  # weight grad
                fl += 3 * 2.0 * M * i * o
            torch.bmm(q, k.transpose(1, 2))   # scores
            torch.bmm(p, v)                   # P V
            torch.bmm(do, v.transpose(1, 2))  # dP
            torch.bmm(p.transpose(1, 2), do)  # dV
            torch.bmm(ds, k)                  # dQ
            torch.bmm(ds.transpose(1, 2), q)  # dK
            fl += 6 * 2.0 * B * H * T * T * hd
        torch.mm(head_x, head_w.t())
        torch.mm(head_dy, head_w)
        torch.mm(head_dy.t(), head_x)
        fl += 3 * 2.0 * M * D * V
        return fl

    step()  # warm-up
    params = L * 12 * D * D + L * 13 * D + V * D * 2 + T * D + 2 * D  # GPT: blocks, embeddings, head, final norm
    model_flops = 6.0 * params * M + 12.0 * L * D * T * M
    for r in range(a.rounds):
        best = max(probe())
        sustained = statistics.median(probe(seconds=a.sustain, windows=max(3, int(a.sustain / 0.02))))
        t0 = clock()
        for _ in range(a.reps):
            gemm_flops = step()
        gemm_s = (clock() - t0) / a.reps
        print(json.dumps(dict(rank=a.rank, round=r, peak_best=best, peak_sustained=sustained, gemm_s=gemm_s,
                              gemm_flops=gemm_flops, model_flops=model_flops)), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sustain", type=float, default=0.3)
    ap.add_argument("--out", default="")
    ap.add_argument("--rank", type=int, default=-1)
    a = ap.parse_args()
    if a.rank >= 0:
        return worker(a)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    load0 = " ".join(open("/proc/loadavg").read().split()[:3])
    args = [sys.executable, __file__, "--rounds", str(a.rounds), "--reps", str(a.reps), "--sustain", str(a.sustain)]
    procs = [subprocess.Popen(args + ["--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env)
             for r in range(a.ranks)]
    recs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"mfu_ceiling: rank process exited with {p.returncode}")
        recs += [json.loads(l) for l in out.splitlines() if l.strip()]
    lines = [f"# bench/mfu_ceiling.py: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, command: "
             f"bench/mfu_ceiling.py {' '.join(sys.argv[1:])}",
             f"# {a.ranks} processes at once, 1 thread each; GPT {SIZE}; load at start {load0}",
             f"# model FLOPs per step per rank {recs[0]['model_flops'] / 1e9:.2f} G (6 N T + 12 L d s T), "
             f"its GEMMs' FLOPs {recs[0]['gemm_flops'] / 1e9:.2f} G",
             "# peak_best: the worker's start-up measurement (best of 3 x 20 ms, 512^3); sustained: median of "
             f"20 ms windows over {a.sustain} s; gemm: one step's GEMMs alone, GFLOP/s of their own FLOPs",
             "# ceiling = model FLOPs / GEMM CPU time / peak: the MFU of a step that spent its time in GEMMs only",
             f"{'round':>5} {'rank':>4} {'peak_best':>10} {'sustained':>10} {'gemm GF/s':>10} {'ceil/best':>10} {'ceil/sust':>10}"]
    cb, cs = [], []
    for rec in sorted(recs, key=lambda x: (x["round"], x["rank"])):
        ceil_b = rec["model_flops"] / rec["gemm_s"] / 1e9 / rec["peak_best"]
        ceil_s = rec["model_flops"] / rec["gemm_s"] / 1e9 / rec["peak_sustained"]
        cb.append(ceil_b)
        cs.append(ceil_s)
        lines.append(f"{rec['round']:>5} {rec['rank']:>4} {rec['peak_best']:>10.1f} {rec['peak_sustained']:>10.1f} "
                     f"{rec['gemm_flops'] / rec['gemm_s'] / 1e9:>10.1f} {ceil_b:>10.3f} {ceil_s:>10.3f}")
    lines.append(f"median ceiling vs the worker's peak (best window): {statistics.median(cb):.3f}; "
                 f"vs the sustained rate: {statistics.median(cs):.3f}; over {len(cb)} (round, rank) pairs")
    lines.append(f"# load at end {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
