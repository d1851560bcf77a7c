"""The chaos campaign's results (bench/chaos/chaos.py): the per-fault table
and summary as markdown (chaos.md), the raw record (chaos.json) and the
timeline picture (chaos.svg: steps over time, each fault's span shaded from
injection to training again)."""
import json
import os

LOSS_TOL = 1e-5  # redone steps' losses vs their first run (relative)


def fmt_s(f, key):
    v = f.get(key)
    return "-" if v is None else "%.2f" % (v - f["at"])


def goodput_line(summary):
    g = summary.get("goodput_json")
    if not g:
        return "- node 0's goodput.json: none"
    secs = g.get("seconds", {})
    parts = ", ".join("%s %.1f s" % (k, v) for k, v in secs.items())
    return "- node 0's goodput.json (its agent's accounting, launch to end): %.1f%% of %.1f s wall (%s)" % (
        100 * g.get("goodput", 0), g.get("wall_s", 0), parts)


def replay_lines(summary):
    if "replay_segments" not in summary:
        return "- final parameters vs a fault-free replay: not checked (--replay)"
    d = summary.get("replay_max_abs_diff")
    line = ("- final parameters vs a fault-free replay of the same membership changes (%s): max |diff| %s "
            "(tolerance 1e-05; every step's loss vs the campaign's records of it: max rel diff %s%s)") % (
        summary["replay_segments"], "-" if d is None else "%.3g" % d,
        "%.3g" % summary["replay_loss_rel_diff"] if summary.get("replay_loss_rel_diff") is not None else "-",
        "" if summary.get("replay_s") is None else "; replay %.1f s" % summary["replay_s"])
    if "control_max_abs_diff" in summary:
        c = summary["control_max_abs_diff"]
        line += "\n- negative control, %s: max |diff| %s (must exceed 1e-03)" % (
            summary["control"], "-" if c is None else "%.3g" % c)
    return line


def by_kind(c, summary):
    """Where each kind's lost time goes: injection to detection, detection to
    training again (stop, re-join, start, load), and the steps trained again
    (at the campaign's mean step time)."""
    step_s = summary["productive_s"] / max(1, len(set(r[1] for r in c.metrics.snapshot())))
    rows = ["| fault kind | n | detect (s, mean) | detect -> train again (s, mean) | steps redone (total) | "
            "redone time (s, total) | lost (s, total) |", "|---|---|---|---|---|---|---|"]
    total = 0.0
    for kind in sorted(set(f["kind"] for f in c.faults)):
        fs = [f for f in c.faults if f["kind"] == kind and f.get("detected") and f.get("trained")]
        if not fs:
            continue
        detect = [f["detected"] - f["at"] for f in fs]
        restart = [max(0.0, f["trained"] - f["detected"]) for f in fs]
        redone = sum(f.get("redone", 0) for f in fs)
        # A fault that never stopped training (a failed save it trained past) loses no wall time here.
        lost = sum(0.0 if f.get("no_stop") else f["trained"] - f["at"] for f in fs) + redone * step_s
        total += lost
        rows.append("| %s | %d | %.2f | %.2f | %d | %.2f | %.1f |" % (
            kind, len(fs), sum(detect) / len(fs), sum(restart) / len(fs), redone, redone * step_s, lost))
    rows.append("| all | %d | | | | | %.1f of %.1f s wall |" % (len(c.faults), total, summary["wall_s"]))
    return "\n".join(rows)


def wall_breakdown(c, summary):
    """Where the wall time went, adding up to it: each step record (by the time
    it was seen, less its step_time_s) gives the time between steps; that and
    a step trained again go to the fault last injected before the step began
    (or to "before the first fault"); before the first step is start-up, after the last
    the end (the final save, the agents' exit)."""
    recs = sorted(c.metrics.snapshot(), key=lambda r: r[0])
    if not recs:
        return "- wall breakdown: no step records"
    faults = sorted(c.faults, key=lambda f: f["at"])
    rows = {}
    def add(key, col, v):
        rows.setdefault(key, [0.0, 0.0, 0])[col] += v
    seen, prev = set(), None
    productive = 0.0
    for r in recs:
        begin = r[0] - r[4]
        owner = [f for f in faults if f["at"] <= begin]
        key = "after " + owner[-1]["kind"] if owner else "before the first fault"
        if prev is not None:
            add(key, 0, begin - prev)
        if r[1] in seen:
            add(key, 1, r[4])
            add(key, 2, 1)
        else:
            seen.add(r[1])
            productive += r[4]
        prev = r[0]
    startup = recs[0][0] - recs[0][4] - c.t0
    end = c.t_end - recs[-1][0]
    first_block = {}
    for _, step, ms in getattr(c.metrics, "ckpt", []):
        first_block.setdefault(step, ms)
    block = sum(first_block.values()) / 1000.0
    out = ["| where | between steps (s) | steps redone (n, s) | total (s) | % of wall |", "|---|---|---|---|---|"]
    wall = c.t_end - c.t0
    out.append("| productive steps | | | %.1f | %.1f |" % (productive, 100 * productive / wall))
    out.append("| start-up (launch to the first step) | | | %.1f | %.1f |" % (startup, 100 * startup / wall))
    total = productive + startup + end
    for key in sorted(rows):
        gap, redo, n = rows[key]
        total += gap + redo
        out.append("| %s | %.1f | %d, %.1f | %.1f | %.1f |" % (key, gap, n, redo, gap + redo,
                                                                       100 * (gap + redo) / wall))
    out.append("| end (last step seen to the agents' exit) | | | %.1f | %.1f |" % (end, 100 * end / wall))
    out.append("| sum (= wall %.1f s) | | | %.1f | |" % (wall, total))
    return "\n".join(out + ["", "- of the time between steps, the step loop stopped for checkpoints and "
                             "in-memory copies %.1f s (ckpt_block_ms over %d steps, rank 0)" % (block, len(first_block))])


def write_results(c, summary):
    rows = ["| # | at (s) | fault | host | step | detect (s) | train again (s) | steps redone | named correctly | "
            "named as |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, f in enumerate(c.faults, 1):
        rows.append("| %d | %.1f | %s | %d | %d | %s | %s | %s | %s | %s |" % (
            n, c.elapsed(f["at"]), f["kind"], f["host"], f["step_at"], fmt_s(f, "detected"),
            fmt_s(f, "trained"), f.get("redone", "-"), "yes" if f.get("correct") else "no", f.get("named", "-").replace("|", "/").replace("\n", " / ")))
    lines = ["# Chaos campaign (seed %d, %d hosts, %d faults)" % (c.a.seed, c.a.hosts, len(c.faults)), "",
             "\n".join(rows), "", by_kind(c, summary), "", wall_breakdown(c, summary), "",
             "- wall time %.1f s, productive step time %.1f s: goodput %.1f%%" % (
                 summary["wall_s"], summary["productive_s"], 100 * summary["goodput"]),
             goodput_line(summary),
             "- redone step records %d; max |loss - first run| / |first run| over redone steps %.3g (tolerance %g)"
             % (summary["redone_records"], summary["max_redo_loss_rel_diff"], LOSS_TOL),
             "- steps never trained: %s" % (summary["missing_steps"] or "none"),
             replay_lines(summary),
             "- /dev/shm segments left: %s" % (summary["new_shm"] or "none"),
             "- named otherwise (detected and recovered, but the fault's own explanation never appeared): %s"
             % (", ".join("#%d %s" % (n, f["kind"]) for n, f in enumerate(c.faults, 1) if not f.get("correct"))
                or "none"),
             "- rounds opened on a hang: %d, hangs injected: %d (more rounds: a hang named where none was "
             "injected, or another fault first named a hang)" % (summary["hang_rounds"], summary["hang_faults"]),
             "- problems: %s" % ("; ".join(c.problems) if c.problems else "none"), ""]
    with open(os.path.join(c.out, "chaos.md"), "w") as f:
        f.write("\n".join(lines))
    faults = [{k: v for k, v in f.items() if k != "mark"} for f in c.faults]
    with open(os.path.join(c.out, "chaos.json"), "w") as f:
        json.dump({"seed": c.a.seed, "t0": c.t0, "faults": faults, "summary": summary,
                   "problems": c.problems}, f, indent=1)
    write_svg(c, os.path.join(c.out, "chaos.svg"))
    return "\n".join(lines)


def write_svg(c, path):
    recs = c.metrics.snapshot()
    wall = max(1.0, c.t_end - c.t0)
    top = max([r[1] for r in recs] + [1])
    W, H, L, B = 900, 320, 50, 40
    x = lambda t: L + (t - c.t0) / wall * (W - L - 10)
    y = lambda s: H - B - s / top * (H - B - 20)
    colors = {"kill_worker": "#d62728", "kill_agent": "#9467bd", "hang": "#ff7f0e", "slow_rank": "#2ca02c",
              "link_cut": "#1f77b4", "full_disk": "#8c564b", "corrupt_ckpt": "#e377c2"}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (W, H + 20),
           '<rect width="100%" height="100%" fill="white"/>',
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - 10, H - B),
           '<line x1="%d" y1="20" x2="%d" y2="%d" stroke="black"/>' % (L, L, H - B),
           '<text x="%d" y="%d">time (s), 0 .. %.0f</text>' % (W // 2 - 40, H - 10, wall),
           '<text x="5" y="15">step (0 .. %d)</text>' % top]
    for f in c.faults:
        end = f.get("trained") or f.get("detected") or f["at"]
        col = colors.get(f["kind"], "gray")
        out.append('<rect x="%.1f" y="20" width="%.1f" height="%d" fill="%s" opacity="0.25"/>'
                   % (x(f["at"]), max(1.0, x(end) - x(f["at"])), H - B - 20, col))
        out.append('<line x1="%.1f" y1="20" x2="%.1f" y2="%d" stroke="%s"/>' % (x(f["at"]), x(f["at"]), H - B, col))
        out.append('<text x="%.1f" y="%d" fill="%s" transform="rotate(-90 %.1f %d)">%s h%d</text>'
                   % (x(f["at"]) + 10, H - B - 5, col, x(f["at"]) + 10, H - B - 5, f["kind"], f["host"]))
    pts = " ".join("%.1f,%.1f" % (x(r[0]), y(r[1])) for r in recs)
    out.append('<polyline points="%s" fill="none" stroke="black" stroke-width="1.5"/>' % pts)
    lx = L + 10
    for kind, col in colors.items():
        out.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (lx, H + 5, col, lx + 14, H + 14, kind))
        lx += 105
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))
