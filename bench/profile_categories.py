#!/usr/bin/env python3
# Folds `perf report --sort dso,sym -F overhead,dso,sym` output of two runs
# (dtrain, peer) into one table of categories: % of the ranks' samples, and
# that share of each side's wall time per step (ms). The categories are by
# library and symbol name, first match wins; "other" is what none matched.
#   profile_categories.py DTRAIN.txt PEER.txt --step-ms DTRAIN_MS PEER_MS
import argparse
import re

HZ = 499.0
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
LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*)$")


def fold(path):
    cats, total = {}, 0.0
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        total += pct
        name = "other"
        for cname, dre, sre in CATS:
            if re.search(dre, dso) and re.search(sre, sym):
                name = cname
                break
        cats[name] = cats.get(name, 0.0) + pct
    return cats, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtrain")
    ap.add_argument("peer")
    ap.add_argument("--step-ms", nargs=2, type=float, required=True, help="wall ms per step: dtrain, peer")
    a = ap.parse_args()
    d, dt = fold(a.dtrain)
    p, pt = fold(a.peer)
    names = [c[0] for c in CATS] + ["other"]
    dm, pm = a.step_ms
    print(f"{'category':38s} {'dtrain %':>9s} {'peer %':>9s} {'dtrain ms':>10s} {'peer ms':>9s}")
    for n in names:
        if d.get(n, 0) < 0.05 and p.get(n, 0) < 0.05:
            continue
        dp, pp = d.get(n, 0) / dt * 100, p.get(n, 0) / pt * 100
        print(f"{n:38s} {dp:9.1f} {pp:9.1f} {dp * dm / 100:10.1f} {pp * pm / 100:9.1f}")
    print(f"{'step (wall)':38s} {100:9.1f} {100:9.1f} {dm:10.1f} {pm:9.1f}")


if __name__ == "__main__":
    main()
