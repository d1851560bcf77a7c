#!/usr/bin/env python3
# compare_params.py: compares the final parameters of two runs, each a merged
# checkpoint (`dtrain ckpt merge RUN/ckpt OUT.safetensors`: one F32 tensor per
# parameter, named by parameter name), tensor by tensor and prints the max
# absolute difference of each and overall; optionally the step-1 losses of the
# two runs' metrics.jsonl, and a negative control (a third merged checkpoint
# from a run that must differ, e.g. another learning rate) that has to exceed
# the tolerance by far, so that a comparison which cannot tell right from wrong
# fails. The step-1 gradient norms are compared too: AdamW's first step is
# about lr * sign(grad), blind to a wrongly scaled gradient.
# Standard library only (safetensors read by its public format; numpy, when
# there is one, only for speed): the GPU machine's Python may lack the
# safetensors package. Exit 0 when every check holds, 1 otherwise.
#
#   compare_params.py A.safetensors B.safetensors [--tol 1e-4] [--names cpu,cuda]
#       [--loss-a A/metrics.jsonl --loss-b B/metrics.jsonl --loss-tol 1e-4 --grad-rtol 1e-4]
#       [--control C.safetensors --control-factor 10]
import argparse
import json
import math
import struct
import sys
from array import array


def fail(msg):
    print(f"compare_params: FAIL: {msg}")
    raise SystemExit(1)


def read_params(path):
    """A safetensors file: u64 little-endian header length N, N bytes of JSON
    {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}},
    then the data. Returns [(name, array('f'))] sorted by name (F32 only)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"{path}: {e.strerror} (was the run's checkpoint merged?)")
    if len(data) < 8:
        fail(f"{path}: not a safetensors file ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        fail(f"{path}: not a safetensors file (header: {e})")
    header.pop("__metadata__", None)
    out = []
    for name in sorted(header):
        info = header[name]
        if info["dtype"] != "F32":
            fail(f"{path}: {name} is {info['dtype']}; only F32 parameters are compared")
        begin, end = info["data_offsets"]
        if 8 + n + end > len(data):
            fail(f"{path}: {name} is cut short")
        values = array("f")
        values.frombytes(data[8 + n + begin:8 + n + end])
        if sys.byteorder != "little":
            values.byteswap()
        out.append((name, values))
    return out


def max_abs_diff(a, b):
    try:  # numpy when there is one (the GPU machine's Python has it): 100x faster
        import numpy as np
        return float(np.max(np.abs(np.frombuffer(a, np.float32).astype(np.float64) -
                                   np.frombuffer(b, np.float32).astype(np.float64)))) if len(a) else 0.0
    except ImportError:
        return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def diff_params(pa, pb, label_a, label_b):
    """Per-tensor max |a - b| in name order; exits on a layout mismatch."""
    if [(n, len(v)) for n, v in pa] != [(n, len(v)) for n, v in pb]:
        names_a = {n: len(v) for n, v in pa}
        names_b = {n: len(v) for n, v in pb}
        diff = sorted(set(names_a.items()) ^ set(names_b.items()))
        print(f"compare_params: FAIL: {label_a} and {label_b} hold different parameters: {diff[:6]}")
        raise SystemExit(1)
    return [(n, max_abs_diff(a, b), len(a)) for (n, a), (_, b) in zip(pa, pb)]


def step1(path):
    """The step-1 record of a metrics.jsonl."""
    try:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("step") == 1:
                    return rec
    except OSError as e:
        print(f"compare_params: FAIL: {path}: {e.strerror}")
        raise SystemExit(1)
    print(f"compare_params: FAIL: {path} has no step 1")
    raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--names", default="a,b", help="labels of the two runs, e.g. cpu,cuda")
    ap.add_argument("--loss-a")
    ap.add_argument("--loss-b")
    ap.add_argument("--loss-tol", type=float, default=1e-4)
    ap.add_argument("--grad-rtol", type=float, default=1e-4, help="relative tolerance of the step-1 grad norms")
    ap.add_argument("--control", help="merged checkpoint of a run that must differ from A by > factor * tol")
    ap.add_argument("--control-factor", type=float, default=10.0)
    args = ap.parse_args()
    la, lb = (args.names.split(",") + ["b"])[:2]

    pa, pb = read_params(args.a), read_params(args.b)
    rows = diff_params(pa, pb, la, lb)
    worst = max((d for _, d, _ in rows), default=0.0)
    values = sum(n for _, _, n in rows)
    print(f"max |{la} - {lb}| per parameter ({len(rows)} tensors, {values} values):")
    width = max((len(n) for n, _, _ in rows), default=4)
    for name, d, n in rows:
        print(f"  {name:<{width}} {n:>9}  {d:.3e}")
    ok = math.isfinite(worst) and worst < args.tol and values > 0
    parts = [f"params max |{la}-{lb}| {worst:.3e} (tol {args.tol:.0e})"]
    print(f"overall: {worst:.3e} over {values} values, tolerance {args.tol:.0e}: {'ok' if ok else 'TOO LARGE'}")

    if args.loss_a and args.loss_b:
        ra, rb = step1(args.loss_a), step1(args.loss_b)
        a, b = float(ra["loss"]), float(rb["loss"])
        d = abs(a - b)
        loss_ok = math.isfinite(d) and d < args.loss_tol
        print(f"step-1 loss: {la} {a:.9f}, {lb} {b:.9f}, |diff| {d:.3e}, "
              f"tolerance {args.loss_tol:.0e}: {'ok' if loss_ok else 'TOO LARGE'}")
        ga, gb = float(ra["grad_norm"]), float(rb["grad_norm"])
        gr = abs(ga - gb) / max(abs(ga), 1e-30)
        grad_ok = math.isfinite(gr) and gr < args.grad_rtol
        print(f"step-1 grad norm: {la} {ga:.9g}, {lb} {gb:.9g}, relative diff {gr:.3e}, "
              f"tolerance {args.grad_rtol:.0e}: {'ok' if grad_ok else 'TOO LARGE'}")
        parts.append(f"loss {a:.6f} vs {b:.6f} (|diff| {d:.1e}); grad norm rel diff {gr:.1e}")
        ok = ok and loss_ok and grad_ok

    if args.control:
        rows_c = diff_params(pa, read_params(args.control), la, "control")
        worst_c = max((d for _, d, _ in rows_c), default=0.0)
        need = args.control_factor * args.tol
        control_ok = worst_c > need
        print(f"negative control: max |{la} - control| {worst_c:.3e}, must exceed "
              f"{args.control_factor:g} x tol = {need:.0e}: {'ok' if control_ok else 'TOO SMALL (the comparison cannot tell right from wrong)'}")
        parts.append(f"control {worst_c:.1e} > {need:.0e}")
        ok = ok and control_ok

    print(f"compare_params: {'PASS' if ok else 'FAIL'}: " + "; ".join(parts))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
