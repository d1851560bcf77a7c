#!/usr/bin/env python3
# Folds `perf report --sort dso,sym -F overhead,dso,sym` output of two runs
# (dtrain, peer) into one table of categories: % of the ranks' samples, and
# CPU ms per step per rank (samples / hz / ranks / steps in the window, steps
# = window / wall step time): comparable between the sides even when the
# machine is shared. The categories are by library and symbol name, first
# match wins; "other" is what none matched.
# The last line is the share of the samples outside MKL's sgemm.
#   profile_categories.py D.txt P.txt --step-ms D_MS P_MS --window-s S --ranks R --hz 499
#   (P.txt "none": dtrain's columns only)
import argparse
import re

CATS = [  # (name, dso regex, symbol regex)
    ("matmul: MKL sgemm", r"libtorch_cpu", r"mkl_|gemm|sgemm"),
    ("matmul: oneDNN", r".", r"dnnl|jit_avx|brgemm"),
    ("gloo / c10d comm", r".", r"gloo|c10d|ProcessGroup|Reducer"),
    ("kernel: elementwise/reduce", r"libtorch_cpu", r"at::native|Vectorized|vec::|cpu_kernel|VectorizedLoop|reduce|softmax|gelu|layer_norm|_GLOBAL__N_1"),
    ("autograd engine", r"libtorch_cpu", r"torch::autograd|autograd::"),
    ("dispatcher / TensorImpl / ATen glue", r"libtorch_cpu|libc10|libtorch\.so", r"."),
    ("malloc / free", r"libc|libstdc|ld-linux", r"malloc|free|_int_|cfree|tcache|brk|mmap|realloc"),
    ("memcpy / memset", r"libc", r"mem(cpy|set|move)"),
    ("libgomp (OpenMP)", r"libgomp", r"."),
    ("python interpreter", r"python|libpython", r"."),
    ("OS kernel", r"kernel", r"."),
    ("dtrain engine code", r"dtrain-worker|dtrain$", r"."),
]
LINE = re.compile(r"^\s*([0-9.]+)%\s+([0-9]+)\s+(\S+)\s+\[[.k]\]\s+(.*)$")


def fold(path):
    cats, total = {}, 0.0
    if path == "none":
        return cats, 1.0
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        n, dso, sym = float(m.group(2)), m.group(3), m.group(4)
        total += n
        name = "other"
        for cname, dre, sre in CATS:
            if re.search(dre, dso) and re.search(sre, sym):
                name = cname
                break
        cats[name] = cats.get(name, 0.0) + n
    return cats, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtrain")
    ap.add_argument("peer")
    ap.add_argument("--step-ms", nargs=2, type=float, required=True, help="wall ms per step: dtrain, peer")
    ap.add_argument("--window-s", type=float, required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--hz", type=float, required=True)
    a = ap.parse_args()
    d, dt = fold(a.dtrain)
    p, pt = fold(a.peer)
    names = [c[0] for c in CATS] + ["other"]
    dm, pm = a.step_ms
    # CPU ms per step per rank of `samples`: samples / hz / ranks / (window / step time)
    dk = 1e3 / a.hz / a.ranks / (a.window_s * 1e3 / dm)
    pk = 1e3 / a.hz / a.ranks / (a.window_s * 1e3 / pm) if pm > 0 else 0.0
    print(f"{'category':38s} {'dtrain %':>9s} {'peer %':>9s} {'dtrain CPU ms':>14s} {'peer CPU ms':>12s}")
    for n in names:
        if d.get(n, 0) < 0.0005 * dt and p.get(n, 0) < 0.0005 * pt:
            continue
        print(f"{n:38s} {d.get(n, 0) / dt * 100:9.1f} {p.get(n, 0) / pt * 100:9.1f} "
              f"{d.get(n, 0) * dk:14.1f} {p.get(n, 0) * pk:12.1f}")
    print(f"{'all (CPU per step per rank)':38s} {100:9.1f} {100:9.1f} {dt * dk:14.1f} {pt * pk:12.1f}")
    print(f"{'wall ms per step':38s} {'':9s} {'':9s} {dm:14.1f} {pm:12.1f}")
    s = CATS[0][0]
    print(f"{'not sgemm (% of CPU samples)':38s} {100 - d.get(s, 0) / dt * 100:9.1f} "
          f"{(100 - p.get(s, 0) / pt * 100) if pt > 1 else 0:9.1f}")


if __name__ == "__main__":
    main()
