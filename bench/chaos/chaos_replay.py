"""The chaos campaign's replay check (chaos.py --replay): the final parameters
equal a fault-free replay of the same membership changes. From the run's
rank_0.log (one section per round: its world, the step it resumed from, the
checkpoints it saved) it derives the lineage of the final checkpoint, the
segments (restored step, world) that produced it, and replays them on this
machine: one `dtrain launch` agent per node on 127.0.0.1 (one rank per node,
Gloo between nodes, as on the test hosts), each segment ending right after
the step the next one restores (its checkpoint, then fault kill_after_step),
the next resuming from the replay's own checkpoint. Not here: running the
campaign (chaos.py), the fault kinds (chaos_faults.py). Standard library only.

Exact by construction: train.steps (the learning-rate schedule) and the data
are the campaign's; the sampler position, the optimizer step and the ranks'
RNG come from the checkpoint each segment resumes from; each segment has the
world (dp, hence grad_accum for the fixed global batch) its round had, so the
gradient sums run in the same order. Consecutive segments with the same world
are replayed as one (a resume is exact; --replay-each-restart keeps them apart).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "support"))
from compare_params import diff_params, read_params  # noqa: E402

PARAM_TOL = 1e-5  # max |final parameter - replay's|
CONTROL_FACTOR = 100  # the negative control must miss by this much

SECTION = re.compile(r"^===== dtrain: .*, round (\d+), restart (\d+), rank 0 =====$")
WORLD = re.compile(r"\]\[rank 0/(\d+)\]")
# From disk (with the sampler's position) or from checkpoint.memory's copies
# (none logged: such a step was never saved, the round that trained through it counts).
RESUMED = re.compile(r"resuming from step (\d+) \((?:.*, sampler at (\d+) samples\)|in-memory copies|live state)")
SAVED = re.compile(r"checkpoint \S*/step_(\d+) (?:saved|committed \(async\))")
STEP = re.compile(r"\] step (\d+)/\d+ \| loss")
GBS = re.compile(r"GBS = micro_batch\((\d+)\) x grad_accum\((\d+)\) x dp\((\d+)\)")


def sections(rank0_log):
    """Rank 0's log, one dict per round: world, restored step (None: no
    resume line), sampler position, checkpoints saved, last step trained."""
    out = []
    with open(rank0_log, errors="replace") as f:
        for line in f:
            m = SECTION.match(line.rstrip("\n"))
            if m:
                out.append({"round": int(m.group(1)), "restart": int(m.group(2)), "world": None, "restored": None,
                            "sampler": None, "saved": [], "top": None, "micro": None, "accum": None})
                continue
            if not out:
                continue
            s = out[-1]
            if s["world"] is None and WORLD.search(line):
                s["world"] = int(WORLD.search(line).group(1))
            if RESUMED.search(line) and WORLD.search(line):
                # The new run's own word on its world: a worker recovering in place
                # may log a line of the old round's world after the header.
                s["world"] = int(WORLD.search(line).group(1))
            for pattern, act in ((RESUMED, lambda m: s.update(restored=int(m.group(1)),
                                                               sampler=int(m.group(2)) if m.group(2) else None)),
                                 (SAVED, lambda m: s["saved"].append(int(m.group(1)))),
                                 (STEP, lambda m: s.update(top=max(s["top"] or 0, int(m.group(1))))),
                                 (GBS, lambda m: s.update(micro=int(m.group(1)), accum=int(m.group(2))))):
                m = pattern.search(line)
                if m:
                    act(m)
    trained = []
    for s in out:
        if s["top"] is None and not s["saved"]:
            continue  # stopped before its first step: nothing of it reaches the final state
        if s["restored"] is None:
            s["restored"] = 0
        trained.append(s)
    return trained


def lineage(secs, final_step):
    """The sections whose training the final checkpoint holds, oldest first:
    the one that saved final_step, the one that saved the step it resumed
    from, and so on back to step 0. Raises ValueError when a link is missing."""
    at = max((i for i, s in enumerate(secs) if final_step in s["saved"]), default=None)
    if at is None:
        raise ValueError("no round of rank_0.log saved the final step %d" % final_step)
    chain = [at]
    while secs[chain[0]]["restored"] > 0:
        r = secs[chain[0]]["restored"]
        before = range(chain[0] - 1, -1, -1)
        # The last round before it that saved step r (its log line may be
        # lost with a SIGKILLed agent: then the last that trained through r).
        w = next((j for j in before if r in secs[j]["saved"]), None)
        if w is None:
            w = next((j for j in before if secs[j]["restored"] < r <= (secs[j]["top"] or 0)), None)
        if w is None:
            raise ValueError("round %d resumed from step %d, which no earlier round trained"
                             % (secs[chain[0]]["round"], r))
        chain.insert(0, w)
    return chain


def segments(secs, chain, final_step, merge=True):
    """(start, stop, world, sampler at start, rounds) per replayed segment."""
    segs = []
    for n, i in enumerate(chain):
        s = secs[i]
        stop = secs[chain[n + 1]]["restored"] if n + 1 < len(chain) else final_step
        if merge and segs and segs[-1]["world"] == s["world"]:
            segs[-1]["stop"] = stop
            segs[-1]["rounds"].append(s["round"])
            continue
        segs.append({"start": s["restored"], "stop": stop, "world": s["world"], "sampler": s["sampler"],
                     "micro": s["micro"], "accum": s["accum"], "rounds": [s["round"]]})
    return segs


def describe(segs):
    return ", ".join("%d-%d on %d node(s)" % (s["start"], s["stop"], s["world"]) for s in segs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def merge_ckpt(dtrain, ckpt_dir, out):
    """`dtrain ckpt merge`: one F32 tensor per parameter. Returns an error text or None."""
    r = subprocess.run([dtrain, "ckpt", "merge", ckpt_dir, out, "--force"], capture_output=True, text=True)
    return None if r.returncode == 0 else "dtrain ckpt merge %s failed: %s" % (ckpt_dir, (r.stdout + r.stderr)[-800:])


def run_segment(c, d, k, seg, alter=None):
    """Trains one segment in <d>: `world` agents on 127.0.0.1, resuming from
    <d>/ckpt's latest (none for the first), stopping after step `stop` and its
    checkpoint. `alter`: extra --set values (the negative control)."""
    port = free_port()
    nodes = seg["world"] if not alter else alter["world"]
    sets = ["log.dir=" + os.path.join(d, "run"), "checkpoint.dir=" + os.path.join(d, "ckpt"),
            "cluster.nodes=%d" % nodes, "cluster.max_restarts=0", "cluster.warm_spares=false",
            "cluster.rendezvous.last_call_s=0",  # every node is there: close the round at once
            # Saved at `stop` only (a multiple of itself), then rank 0 dies.
            "checkpoint.every=%d" % seg["stop"], "checkpoint.keep=2",
            # Synchronous, disk only: how a state is saved does not change the
            # numbers, and the campaign's steps restored from memory are
            # compared with the same steps read back from disk here.
            "checkpoint.async=false", "checkpoint.memory.every=0",
            "fault.kind=kill_after_step", "fault.rank=0", "fault.step=%d" % seg["stop"]]
    if alter:
        sets += alter["sets"]
    env = dict(os.environ, DTRAIN_TOKEN="chaos-replay", DTRAIN_NO_REBUILD="1")
    procs = []
    for i in range(nodes):
        argv = [c.dtrain, "launch", c.spec, "--node-rank", str(i), "--rdzv", "127.0.0.1:%d" % port]
        for s in sets:
            argv += ["--set", s]
        log = open(os.path.join(d, "segment%d_node%d.log" % (k, i)), "w")
        procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True), log))
    end = time.time() + c.a.recover_timeout_s + 2 * (seg["stop"] - seg["start"])
    for p, log in procs:
        try:
            p.wait(timeout=max(1.0, end - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    latest = os.path.join(d, "ckpt", "latest")
    got = open(latest).read().strip() if os.path.exists(latest) else "none"
    if got != "step_%d" % seg["stop"]:
        return "replay segment %d (%s): latest is %s, not step_%d (logs %s/segment%d_node*.log)" % (
            k, describe([seg]), got, seg["stop"], d, k)
    return None


def replay(c, segs, tag, alter_at=None, alter=None):
    """Replays segs into <out>/<tag>; returns (merged final file, error text, sampler mismatches)."""
    d = os.path.join(c.out, tag)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for k, seg in enumerate(segs):
        err = run_segment(c, d, k, seg, alter if k == alter_at else None)
        if err:
            return None, err, []
    mismatches = []  # the replay resumed where the campaign did, with the sampler where it was
    replayed = sections(os.path.join(d, "run", "rank_0.log"))
    for k, seg in enumerate(segs[1:], 1):
        got = [s for s in replayed if s["restored"] == seg["start"]]
        if alter is None and seg["sampler"] is not None and (not got or got[0]["sampler"] != seg["sampler"]):
            mismatches.append("segment %d resumed from step %d with the sampler at %s samples, the campaign at %s"
                              % (k, seg["start"], got[0]["sampler"] if got else "?", seg["sampler"]))
    out = os.path.join(d, "final.merged.safetensors")
    return out, merge_ckpt(c.dtrain, os.path.join(d, "ckpt"), out), mismatches


def step_losses(metrics_path):
    """step -> every loss metrics.jsonl holds for it."""
    out = {}
    try:
        with open(metrics_path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "loss" in r and "step" in r:
                    out.setdefault(int(r["step"]), []).append(float(r["loss"]))
    except OSError:
        pass
    return out


def loss_diff(campaign, replayed):
    """Max |campaign - replay| / |campaign| over every campaign record of a replayed step."""
    worst = 0.0
    for step, losses in replayed.items():
        for x in campaign.get(step, []):
            worst = max(worst, abs(x - losses[0]) / max(abs(x), 1e-12))
    return worst


def max_diff(a, b):
    try:
        rows = diff_params(read_params(a), read_params(b), "campaign", "replay")
    except SystemExit:  # compare_params reports and exits on unreadable files and layout mismatches
        return None, 0
    return max((d for _, d, _ in rows), default=0.0), sum(n for _, _, n in rows)


def check_replay(c, final_step, real_merged):
    """Runs the replay (and the negative control with --replay-control);
    returns the summary's fields and appends to c.problems."""
    t0 = time.time()
    res = {"replay_segments": None, "replay_max_abs_diff": None, "replay_s": None}
    try:
        secs = sections(os.path.join(c.run_dir, "rank_0.log"))
        segs = segments(secs, lineage(secs, final_step), final_step, merge=not c.a.replay_each_restart)
    except (OSError, ValueError) as e:
        c.problems.append("replay: %s" % e)
        return res
    res["replay_segments"] = describe(segs)
    merged, err, mismatches = replay(c, segs, "replay")
    c.problems.extend("replay: " + m for m in mismatches)
    if err:
        c.problems.append("replay: " + err)
        return res
    worst, values = max_diff(real_merged, merged)
    res.update(replay_max_abs_diff=worst, replay_values=values, replay_s=time.time() - t0,
               replay_loss_rel_diff=loss_diff(step_losses(os.path.join(c.run_dir, "metrics.jsonl")),
                                              step_losses(os.path.join(c.out, "replay", "run", "metrics.jsonl"))))
    print("chaos: final parameters (step %d) vs a fault-free replay of %s: max |diff| %s over %d values "
          "(tolerance %g; every step's loss vs the campaign's: max rel diff %.3g; replay %.1f s)"
          % (final_step, describe(segs), "?" if worst is None else "%.3g" % worst, values, PARAM_TOL,
             res["replay_loss_rel_diff"], res["replay_s"]), flush=True)
    if worst is None or worst > PARAM_TOL:
        c.problems.append("final parameters differ from the fault-free replay by %s (tolerance %g)"
                          % (worst, PARAM_TOL))
    if c.a.replay_control:
        control_check(c, segs, real_merged, res)
    return res


def control_check(c, segs, real_merged, res):
    """The negative control: the longest segment replayed on one node more
    (or fewer) with its own round's grad_accum, so it trains another global
    batch (what a round that read another round's spec did). It must miss
    the campaign's parameters by more than CONTROL_FACTOR x the tolerance."""
    k = max(range(len(segs)), key=lambda i: segs[i]["stop"] - segs[i]["start"])
    seg = segs[k]
    world = seg["world"] - 1 if seg["world"] > 1 else seg["world"] + 1
    gbs = seg["micro"] * seg["accum"] * world
    alter = {"world": world, "sets": ["train.grad_accum=%d" % seg["accum"], "train.global_batch=%d" % gbs]}
    merged, err, _ = replay(c, segs, "replay_control", alter_at=k, alter=alter)
    if err:
        c.problems.append("replay control: " + err)
        return
    worst, _ = max_diff(real_merged, merged)
    res["control"] = "segment %d (%s) on %d node(s) with grad_accum %d (global batch %d)" % (
        k, describe([seg]), world, seg["accum"], gbs)
    res["control_max_abs_diff"] = worst
    need = CONTROL_FACTOR * PARAM_TOL
    print("chaos: negative control, %s: max |diff| %s, must exceed %g x tolerance = %g: %s"
          % (res["control"], worst, CONTROL_FACTOR, need, "ok" if worst and worst > need else "TOO SMALL"), flush=True)
    if worst is None or worst <= need:
        c.problems.append("the replay's negative control differs by only %s (needs > %g)" % (worst, need))


def main():
    """Prints the segments a run's rank_0.log says its final checkpoint came from."""
    import argparse
    p = argparse.ArgumentParser(description="the replay segments (restored step, world) of a run's final checkpoint")
    p.add_argument("rank0_log")
    p.add_argument("final_step", type=int)
    p.add_argument("--each-restart", action="store_true", help="one segment per restart, not per membership change")
    a = p.parse_args()
    try:
        secs = sections(a.rank0_log)
        segs = segments(secs, lineage(secs, a.final_step), a.final_step, merge=not a.each_restart)
    except (OSError, ValueError) as e:
        print("chaos_replay: %s" % e)
        return 1
    print("segments: %s" % describe(segs))
    for s in segs:
        print("  steps %d-%d on %d node(s), sampler at %s samples, rounds %s" % (
            s["start"], s["stop"], s["world"], s["sampler"] if s["sampler"] is not None else 0,
            ",".join(map(str, s["rounds"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
