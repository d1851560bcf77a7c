#!/usr/bin/env python3
"""Merges a kept chaos campaign's logs into one timeline between two times:
every line of the agents' logs (their workers' output is relayed into them)
that carries an HH:MM:SS.mmm stamp near its start, sorted by that stamp and
prefixed with its log's name. The test hosts share one clock, so the stamps
compare. Python standard library only.

    bench/chaos/chaos_timeline.py /tmp/gp2_k4 15:13:39.0 15:13:46.0
"""
import glob
import os
import re
import sys

STAMP = re.compile(r"(\d\d:\d\d:\d\d\.\d{3})")


def lines_between(out_dir, lo, hi):
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "agent*.log"))):
        name = os.path.basename(path)[:-len(".log")]
        with open(path, errors="replace") as f:
            for line in f:
                m = STAMP.search(line[:60])  # a relayed worker line: "[rank 0] [hh:mm:ss.mmm]..."
                if m and lo <= m.group(1) < hi:
                    rows.append((m.group(1), name, line.rstrip()))
    rows.sort(key=lambda r: r[0])  # stable: one log's lines keep their order within a stamp
    return rows


def main(argv):
    if len(argv) != 4:
        sys.exit("usage: chaos_timeline.py OUT_DIR FROM TO   (times as HH:MM:SS.mmm, as in the logs)")
    for _, name, line in lines_between(argv[1], argv[2], argv[3]):
        print(name, line)


if __name__ == "__main__":
    main(sys.argv)
