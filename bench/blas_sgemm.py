#!/usr/bin/env python3
# Single-thread sgemm GFLOP/s on this machine, one table, ratios vs MKL:
#   mkl        torch.mm in the venv (the wheel's MKL, the BLAS the engine links),
#              torch.set_num_threads(1); torch.__config__.show()'s BLAS line printed
#   openblas   Debian's OpenBLAS 0.3.21 (libopenblas0-pthread) through ctypes
#              cblas_sgemm on numpy buffers: its default core choice, then forced
#              with OPENBLAS_CORETYPE (SkylakeX, Haswell, Prescott = plain SSE3)
#   numpy      numpy's bundled OpenBLAS (scipy-openblas) via np.matmul, for reference
#   bf16       torch.mm on bfloat16 (oneDNN), same sizes
# Each row runs in its own process (OPENBLAS_CORETYPE is read at load time, and
# torch's MKL never shares a process with Debian's OpenBLAS). C = A @ B, square
# n x n, row-major; every result is checked against a float64 product of a few
# rows. GFLOP/s = 2 n^3 / time, median of REPS timed calls after one warm-up,
# from process CPU time (robust to a shared machine) and from wall time; all
# rows run ROUNDS times interleaved and each cell is the median over rounds.
# Not here: multi-threaded BLAS, other shapes, sgemm through the engine itself.
#   $VENV/bin/python bench/blas_sgemm.py [--sizes 512,1024,2048] [--reps 5] [--rounds 3] [--out bench/results/blas.txt]
import argparse
import ctypes
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import numpy as np

DEBIAN_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
CBLAS_ROW_MAJOR, CBLAS_NO_TRANS = 101, 111

# (label, kind, OPENBLAS_CORETYPE or None)
ROWS = [
    ("mkl (torch.mm fp32)", "mkl", None),
    ("openblas 0.3.21 default", "openblas", None),
    ("openblas 0.3.21 SkylakeX", "openblas", "SkylakeX"),
    ("openblas 0.3.21 Haswell", "openblas", "Haswell"),
    ("openblas 0.3.21 Prescott", "openblas", "Prescott"),
    ("numpy's openblas (np.matmul)", "numpy", None),
    ("bf16 (torch.mm bf16)", "bf16", None),
]


def time_calls(fn, reps):
    """Median seconds of fn() over reps calls after one warm-up: (cpu, wall)."""
    fn()
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall)


def check(a, b, c, n, tol):
    """Max relative error of the first rows of c vs a float64 product; raises past tol."""
    rows = min(8, n)
    ref = a[:rows].astype(np.float64) @ b.astype(np.float64)
    err = float(np.max(np.abs(c[:rows].astype(np.float64) - ref)) / np.max(np.abs(ref)))
    if err > tol:
        raise SystemExit(f"blas_sgemm: wrong result at n={n}: max rel err {err:.2e} > {tol:.0e}")
    return err


def inputs(n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b, np.zeros((n, n), dtype=np.float32)


def run_one(kind, sizes, reps):
    """Child process: measures one row, prints one JSON line."""
    info, res = {}, {}
    if kind in ("mkl", "bf16"):
        import torch
        torch.set_num_threads(1)
        cfg = torch.__config__.show().splitlines()
        info["blas"] = "; ".join(l.strip(" -").split(" (Git Hash")[0] for l in cfg
                                 if "Math Kernel" in l or "MKL-DNN" in l)
        info["blas_info"] = (re.findall(r"BLAS_INFO=(\w+)", "\n".join(cfg)) or ["?"])[0]
        info["cpu_capability"] = next((l.split(":")[1].strip() for l in cfg if "CPU capability" in l), "?")
        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
    elif kind == "openblas":
        lib = ctypes.CDLL(os.environ.get("OPENBLAS_LIB", DEBIAN_OPENBLAS))
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_set_num_threads(1)
        info["corename"] = lib.openblas_get_corename().decode()
        info["config"] = lib.openblas_get_config().decode()
        info["lib"] = os.path.realpath(os.environ.get("OPENBLAS_LIB", DEBIAN_OPENBLAS))
        i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        lib.cblas_sgemm.restype = None
    elif kind == "numpy":
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name', '?')} {blas.get('version', '?')}"
        info["numpy"] = np.__version__
        # The build-time config names the build's TARGET; ask the loaded library for its core.
        libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*.so"))
        if libs:
            nlib = ctypes.CDLL(libs[0])
            nlib.scipy_openblas_get_corename64_.restype = ctypes.c_char_p
            info["corename"] = nlib.scipy_openblas_get_corename64_().decode()
    for n in sizes:
        a, b, c = inputs(n)
        if kind == "mkl":
            ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))  # share numpy's buffers
            fn = lambda: torch.mm(ta, tb, out=tc)
            tol = 1e-4
        elif kind == "bf16":
            ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
            tc = torch.empty((n, n), dtype=torch.bfloat16)
            fn = lambda: torch.mm(ta, tb, out=tc)
            tol = 3e-2  # bf16 inputs and output: 8-bit mantissa
        elif kind == "openblas":
            pa, pb, pc = (x.ctypes.data for x in (a, b, c))
            fn = lambda: lib.cblas_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS,
                                         n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n)
            tol = 1e-4
        else:
            fn = lambda: np.matmul(a, b, out=c)
            tol = 1e-4
        cpu, wall = time_calls(fn, reps)
        if kind == "bf16":
            c = tc.float().numpy()
        err = check(a, b, c, n, tol)
        flop = 2.0 * n ** 3
        res[str(n)] = {"gflops_cpu": flop / cpu / 1e9, "gflops_wall": flop / wall / 1e9,
                       "ms_cpu": 1e3 * cpu, "max_rel_err": err}
    print(json.dumps({"kind": kind, "info": info, "results": res}), flush=True)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def cpu_flags(names):
    """Which of names this CPU's flags have (bf16/AMX decide oneDNN's bf16 path)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(l for l in f if l.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return "?"
    have = [n for n in names if n in flags]
    return " ".join(have) if have else "none of " + " ".join(names)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,1024,2048")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: one row
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.one:
        return run_one(a.one, sizes, a.reps)

    # Rounds run every row in turn, so a busy spell of a shared machine hits all
    # rows alike; each cell is the median over rounds of the per-round medians.
    recs = {label: [] for label, _, _ in ROWS}
    for r in range(a.rounds):
        for label, kind, coretype in ROWS:
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
            env.pop("OPENBLAS_CORETYPE", None)
            if coretype:
                env["OPENBLAS_CORETYPE"] = coretype
            out = subprocess.run([sys.executable, __file__, "--one", kind, "--sizes", a.sizes,
                                  "--reps", str(a.reps)], env=env, check=True, capture_output=True,
                                 text=True)
            recs[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"blas_sgemm: round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for label, kind, coretype in ROWS:
        rounds = recs[label]
        res = {}
        for n in map(str, sizes):
            res[n] = {k: statistics.median(x["results"][n][k] for x in rounds)
                      for k in ("gflops_cpu", "gflops_wall", "ms_cpu")}
            res[n]["max_rel_err"] = max(x["results"][n]["max_rel_err"] for x in rounds)
            res[n]["gflops_cpu_rounds"] = [round(x["results"][n]["gflops_cpu"], 1) for x in rounds]
        rows.append((label, coretype, {"kind": kind, "info": rounds[0]["info"], "results": res}))

    mkl = rows[0][2]["results"]
    lines = [
        f"# bench/blas_sgemm.py: single-thread sgemm, C = A @ B square row-major fp32, "
        f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}",
        f"# CPU: {cpu_model()}, {os.cpu_count()} cores; load average at end: "
        f"{' '.join(open('/proc/loadavg').read().split()[:3])}",
        f"# CPU flags: {cpu_flags(['avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_bf16', 'amx_tile'])}",
        f"# GFLOP/s = 2 n^3 / median process CPU time of {a.reps} calls after a warm-up, median of "
        f"{a.rounds} interleaved rounds (per-round and wall-time figures in the JSON below); "
        f"ratio = GFLOP/s / MKL's at the same n",
    ]
    for label, coretype, rec in rows:
        desc = ", ".join(f"{k}={v}" for k, v in rec["info"].items())
        lines.append(f"# {label}: {desc}" + (f" (OPENBLAS_CORETYPE={coretype})" if coretype else ""))
    head = f"{'BLAS':30}" + "".join(f" {'n=' + str(n):>9} {'ratio':>6}" for n in sizes)
    lines.append(head)
    for label, _, rec in rows:
        cells = ""
        for n in sizes:
            g = rec["results"][str(n)]["gflops_cpu"]
            cells += f" {g:9.1f} {g / mkl[str(n)]['gflops_cpu']:6.2f}"
        lines.append(f"{label:30}{cells}")
    for label, _, rec in rows:
        lines.append(json.dumps({"bench": "blas_sgemm", "row": label, **rec}))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
