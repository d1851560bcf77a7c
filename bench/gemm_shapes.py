#!/usr/bin/env python3
# The compute-bound size's own GEMMs, one thread: are they at this CPU's
# sgemm limit, or would another BLAS or another call shape give more?
#   mkl    torch.mm / torch.addmm in the venv (the wheel's MKL: what the
#          engine and the PyTorch peers both run)
#   blis   Debian's BLIS (libblis4-serial, its own per-CPU kernels: zen3 on
#          AMD EPYC Milan) through ctypes cblas_sgemm on the same buffers;
#          the row is skipped, and says so, where the library is missing
#          (apt-get install libblis4-serial)
# Shapes: the 4 linears of a GPT block at d_model D (qkv D->3D, attention
# out D->D, fc D->4D, proj 4D->D) for TOKENS rows (micro_batch x seq), each
# as its forward (x W^T), input grad (dY W) and weight grad (dY^T x); and
# the forward with its bias as ATen's linear runs it (addmm: the bias copied
# into the output, then beta = 1) against mm alone and mm then add_.
# GFLOP/s from process CPU time, median of ROUNDS interleaved rounds (the
# order flips every round) of REPS calls after 3 warm-ups; every result is
# checked against float64.
#   $VENV/bin/python bench/gemm_shapes.py [--d-model 512] [--tokens 512] [--reps 10] [--rounds 5] [--out F]
import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

BLIS = "/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4"
ROW_MAJOR, NO_T, T = 101, 111, 112


def load_blis():
    if not os.path.exists(BLIS):
        return None, f"{BLIS} not installed (apt-get install libblis4-serial)"
    lib = ctypes.CDLL(BLIS)
    lib.bli_arch_query_id.restype = ctypes.c_int
    lib.bli_arch_string.restype = ctypes.c_char_p
    lib.bli_info_get_version_str.restype = ctypes.c_char_p
    f = lib.cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    info = f"BLIS {lib.bli_info_get_version_str().decode()}, kernels {lib.bli_arch_string(lib.bli_arch_query_id()).decode()}"
    return f, info


def timed(fn, reps):
    for _ in range(3):
        fn()
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blis, blis_info = load_blis()
    out_lines = []

    def say(s=""):
        print(s, flush=True)
        out_lines.append(s)

    cfg = torch.__config__.show().splitlines()
    mkl = next((l.strip(" -") for l in cfg if "Math Kernel" in l), "?")
    say(f"# bench/gemm_shapes.py: the compute-bound GPT's GEMMs, 1 thread, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
    say(f"# command: {' '.join(['bench/gemm_shapes.py'] + sys.argv[1:])}")
    say(f"# torch {torch.__version__}: {mkl}; {blis_info}")
    say(f"# load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    say(f"# d_model {a.d_model}, {a.tokens} rows; GFLOP/s from process CPU time, median of {a.rounds} interleaved rounds of {a.reps} calls")
    D, M = a.d_model, a.tokens
    linears = [("qkv", D, 3 * D), ("attn_out", D, D), ("fc", D, 4 * D), ("proj", 4 * D, D)]

    def blis_mm(x, y, out, tx, ty):  # out = op(x) @ op(y), x, y row-major contiguous
        k = x.shape[0] if tx else x.shape[1]
        blis(ROW_MAJOR, T if tx else NO_T, T if ty else NO_T, out.shape[0], out.shape[1], k, 1.0,
             x.data_ptr(), x.shape[1], y.data_ptr(), y.shape[1], 0.0, out.data_ptr(), out.shape[1])

    say("## sgemm: MKL vs BLIS on the same operands (time ratio > 1: BLIS faster)")
    say(f"{'gemm':<16}{'M':>6}{'N':>6}{'K':>6}{'mkl GF/s':>10}{'blis GF/s':>11}{'mkl/blis time':>15}{'max rel err':>13}")
    tot = {"mkl": 0.0, "blis": 0.0}
    for name, fin, fout in linears:
        for kind, (m, n, k, tx, ty) in {"fwd": (M, fout, fin, False, True), "dX": (M, fin, fout, False, False),
                                        "dW": (fout, fin, M, True, False)}.items():
            x = torch.randn(k, m) if tx else torch.randn(m, k)
            y = torch.randn(n, k) if ty else torch.randn(k, n)
            X, Y = (x.t() if tx else x), (y.t() if ty else y)
            out = torch.empty(m, n)
            ref = X.double() @ Y.double()
            runs = {"mkl": lambda: torch.mm(X, Y, out=out)}
            if blis:
                runs["blis"] = lambda: blis_mm(x, y, out, tx, ty)
            t = {kk: [] for kk in runs}
            err = 0.0
            for r in range(a.rounds):
                for kk in (list(runs) if r % 2 == 0 else list(reversed(list(runs)))):
                    t[kk].append(timed(runs[kk], a.reps))
                    err = max(err, ((out.double() - ref).abs().max() / ref.abs().max()).item())
            med = {kk: statistics.median(v) for kk, v in t.items()}
            fl = 2.0 * m * n * k
            for kk in med:
                tot[kk] += med[kk]
            b = f"{fl / med['blis'] / 1e9:>11.1f}{med['mkl'] / med['blis']:>15.3f}" if blis else f"{'-':>11}{'-':>15}"
            say(f"{name + ' ' + kind:<16}{m:>6}{n:>6}{k:>6}{fl / med['mkl'] / 1e9:>10.1f}{b}{err:>13.1e}")
    if blis:
        say(f"all 12: mkl {tot['mkl'] * 1e3:.2f} ms, blis {tot['blis'] * 1e3:.2f} ms, mkl/blis time {tot['mkl'] / tot['blis']:.3f}")
    else:
        say(f"all 12: mkl {tot['mkl'] * 1e3:.2f} ms; blis: skipped ({blis_info})")

    say("## the forward with its bias: addmm (ATen's linear) vs mm alone vs mm then add_ (time ratio < 1: faster than addmm)")
    say(f"{'linear':<10}{'addmm GF/s':>12}{'mm GF/s':>10}{'mm+add_ GF/s':>14}{'mm/addmm':>10}{'(mm+add_)/addmm':>17}")
    sums = {"addmm": 0.0, "mm": 0.0, "mm+add_": 0.0}
    for name, fin, fout in linears:
        x, w, b = torch.randn(M, fin), torch.randn(fout, fin), torch.randn(fout)
        runs = {"addmm": lambda: torch.addmm(b, x, w.t()), "mm": lambda: torch.mm(x, w.t()),
                "mm+add_": lambda: torch.mm(x, w.t()).add_(b)}
        t = {kk: [] for kk in runs}
        for r in range(a.rounds):
            for kk in (list(runs) if r % 2 == 0 else list(reversed(list(runs)))):
                t[kk].append(timed(runs[kk], a.reps))
        med = {kk: statistics.median(v) for kk, v in t.items()}
        for kk in med:
            sums[kk] += med[kk]
        fl = 2.0 * M * fin * fout
        say(f"{name:<10}{fl / med['addmm'] / 1e9:>12.1f}{fl / med['mm'] / 1e9:>10.1f}{fl / med['mm+add_'] / 1e9:>14.1f}"
            f"{med['mm'] / med['addmm']:>10.3f}{med['mm+add_'] / med['addmm']:>17.3f}")
    say(f"all 4: addmm {sums['addmm'] * 1e3:.2f} ms, mm {sums['mm'] * 1e3:.2f} ms, mm+add_ {sums['mm+add_'] * 1e3:.2f} ms")
    say(f"# load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(out_lines) + "\n")


if __name__ == "__main__":
    main()
