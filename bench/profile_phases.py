#!/usr/bin/env python3
# Wall time per step by phase from a run's timeline trace (log.trace.steps:
# <log.dir>/trace/rank_<r>.json), mean over ranks and traced steps: data,
# forward, backward, the gradient sync's finish, optimizer, the rest of the
# step; and, inside those, the time blocked in collectives (their wait_ns).
#   profile_phases.py LOG_DIR/trace
import glob
import json
import sys

PHASES = ["data", "forward", "backward", "grad_sync", "optimizer"]


def main():
    files = sorted(glob.glob(sys.argv[1] + "/rank_*.json"))
    if not files:
        sys.exit(f"profile_phases: no rank_*.json in {sys.argv[1]}")
    tot = {k: 0.0 for k in PHASES + ["step", "collective wait"]}
    steps = 0
    for f in files:
        j = json.load(open(f))
        steps += j["steps"][1] - j["steps"][0] + 1
        for kind, b, e, wait, *_ in j["spans"]:
            if kind in tot:
                tot[kind] += (e - b) / 1e6
            if kind == "collective":
                tot["collective wait"] += wait / 1e6
    per = {k: v / steps for k, v in tot.items()}
    rest = per["step"] - sum(per[k] for k in PHASES)
    print(f"{'phase (wall ms per step, mean of ' + str(len(files)) + ' ranks)':48s} {'ms':>8s} {'% of step':>10s}")
    for k in PHASES:
        print(f"{k:48s} {per[k]:8.1f} {100 * per[k] / per['step']:10.1f}")
    print(f"{'rest of the step':48s} {rest:8.1f} {100 * rest / per['step']:10.1f}")
    print(f"{'step':48s} {per['step']:8.1f} {100.0:10.1f}")
    print(f"{'  of which blocked in collectives (all phases)':48s} {per['collective wait']:8.1f} "
          f"{100 * per['collective wait'] / per['step']:10.1f}")


if __name__ == "__main__":
    main()
