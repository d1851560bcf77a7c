#!/usr/bin/env python3
"""CPU ms per step of every rank of a running job, for bench/pp_ab.sh and
bench/pp_peer_ratio.sh: watches FILE for lines whose REGEX group 1 is the
step, and when the step reaches FROM and then TO reads the user + system CPU
(/proc/<pid>/stat, all threads) of every process below PID that has RANK in
its environment. Prints "r0/r1/..." (ms per step, by RANK) or "na" when the
job ended before TO. It only reads /proc; the job runs as it would without it.
  pp_rank_cpu.py PID FILE REGEX FROM TO
"""
import os
import re
import sys
import time

TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def ranks_below(root):
    """{rank: pid} of the processes under root with RANK in their environment."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out = {}
    for pid in parent:
        p, seen = pid, 0
        while p in parent and p != root and seen < 64:
            p, seen = parent[p], seen + 1
        if p != root or pid == root:
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = pid
    return out


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def step_of(path, regex):
    try:
        steps = [int(m.group(1)) for m in regex.finditer(open(path).read())]
    except OSError:
        return -1
    return max(steps, default=-1)


def main():
    root, path, regex, first, last = int(sys.argv[1]), sys.argv[2], re.compile(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start = None  # (step, {rank: (pid, ticks)})
    while os.path.exists(f"/proc/{root}"):
        step = step_of(path, regex)
        try:
            if start is None and step >= first:
                start = (step, {r: (pid, cpu_ticks(pid)) for r, pid in ranks_below(root).items()})
            elif start is not None and step >= last:
                n = step - start[0]
                per = [TICK_MS * (cpu_ticks(pid) - t0) / n for _, (pid, t0) in sorted(start[1].items())]
                print("/".join(f"{x:.1f}" for x in per) if per else "na")
                return
        except OSError:  # a rank exited between the scan and the read
            break
        time.sleep(0.05)
    print("na")


if __name__ == "__main__":
    main()
