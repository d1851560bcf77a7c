#!/usr/bin/env python3
"""Failure detection and recovery on 3 test hosts (scripts/testhosts; root).

An elastic job (cluster.nodes "2:3", one worker per host, parallel.dp auto,
train.grad_accum auto with a fixed train.global_batch, a checkpoint every 4
steps, steps paced to >= 40 ms by fault.kind slow, which changes no number)
trains; host 2's link is cut mid-run. On this machine's clock, from the
moment the link goes down:
  named    the rendezvous names the lost node (node 0's log: "declared dead")
  formed   the survivors' round 2 closed (workers stopped, re-joined, last call)
  training the first step of round 2 on the 2 survivors (metrics.jsonl)
Then host 2 comes back (link up, a new agent there: the cut one gave up at
once, rejoin_timeout_s 0, so that it cannot take node rank 2 first); from its start:
  grown    round 3 closed on 3 nodes (the survivors' workers saved on SIGTERM)
  training the first step of round 3 on all 3
The peer, in the same run: a fresh 2-host launch of the same spec, from its
start to its first step (what a restart from scratch pays for worker start-up,
Gloo set-up and one step); a round's "formed -> training" is the same work
plus the checkpoint load. Prints every run, the medians and the ratios,
and the recovery's timeline from the logs' stamps (detection, the survivors'
stop, the round's close, worker start and library load, Gloo set-up, the
restore, the first step: see TIMELINE).

With --memory the spec adds checkpoint.memory {every: 1, replicas: 1}: the
survivors restore round 2 from the copies in the nodes' memory (node 0's log:
"restored step N of rank 2 from peer memory"), not from the disk checkpoint.
With --in-place the spec sets cluster.recover_in_place: true (the survivors'
workers get round 2's environment from their agents and train it in the same
processes; "stopping" is then the last survivor's "keeping" line), with
--restart false (they are stopped and new workers start); with neither the
field is absent (the build's default). With --defaults grace_s and
last_call_s keep their defaults (5 s each) instead of 1 s. --heartbeat=S sets
cluster.rendezvous.heartbeat_s (default 0.5; a node is declared dead after 3
missed beats, so detection takes about 3 S). "Today" vs "now": the same
command with DTRAIN_BUILD_DIR of the two builds.

Usage: sudo bench/elastic_recovery.py [RUNS] [--memory] [--defaults] [--in-place | --restart]
       [--heartbeat=S]
(DTRAIN_BUILD_DIR, default build/; DTRAIN_BENCH_KEEP=1 keeps the agents' logs)
"""
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
DTRAIN = os.path.join(BUILD, "apps", "dtrain", "dtrain")
TESTHOSTS = os.path.join(ROOT, "scripts", "testhosts")
HEARTBEAT_S, LAST_CALL_S, GRACE_S = 0.5, 1.0, 1.0
for _arg in sys.argv[1:]:
    if _arg.startswith("--heartbeat="):
        HEARTBEAT_S = float(_arg.split("=", 1)[1])
DEFAULTS = "--defaults" in sys.argv
if DEFAULTS:
    LAST_CALL_S, GRACE_S = 5.0, 5.0
MEMORY = ", memory: {every: 1, replicas: 1}" if "--memory" in sys.argv else ""
IN_PLACE = "--in-place" in sys.argv  # cluster.recover_in_place: the survivors keep their workers
RESTART = "--restart" in sys.argv    # ... false: they are stopped, new workers start
# Absent with neither (the build's default; older builds lack the field).
IN_PLACE_FIELD = " recover_in_place: true," if IN_PLACE else " recover_in_place: false," if RESTART else ""
POLL_S = 0.01


def addr(i):
    return "10.251.77.%d" % (10 + i)


def testhosts(*args):
    subprocess.run([TESTHOSTS, *args], check=True, stdout=subprocess.DEVNULL)


def fresh_hosts():
    # New namespaces for every run: nothing of the last one (links cut,
    # sockets in TIME_WAIT) carries over.
    testhosts("down")
    testhosts("up", "3")


def word_salad(n):
    words = ["the ", "model ", "learns ", "a ", "distributed ", "gradient ", "bucket ", "of ",
             "bytes ", "and ", "every ", "rank ", "sums ", "its ", "share\n", "while ",
             "backward ", "runs. "]
    out, x = [], 12345
    while sum(map(len, out)) < n:
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(words[x % len(words)])
    return "".join(out)[:n]


def write_spec(work, run, nodes):
    path = os.path.join(work, "spec_%s.yaml" % os.path.basename(run))
    with open(path, "w") as f:
        f.write(f"""job: {{name: elastic-bench, seed: 1234}}
cluster: {{nodes: "{nodes}", procs_per_node: 1, device: cpu, backend: gloo, grace_s: {GRACE_S},{IN_PLACE_FIELD}
          rendezvous: {{heartbeat_s: {HEARTBEAT_S}, last_call_s: {LAST_CALL_S}, join_timeout_s: 30,
                        rejoin_timeout_s: 0}}}}
parallel: {{dp: auto}}
model: {{kind: gpt, vocab: 256, layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.0}}
fault: {{kind: slow, rank: 0, step: 1, ms: 40}}
train: {{steps: 60, micro_batch: 2, global_batch: 12, grad_accum: auto, lr: 3.0e-3, warmup_steps: 3}}
data: {{path: {work}/text.txt, format: bytes}}
checkpoint: {{dir: {run}/ckpt, every: 4, keep: 20{MEMORY}}}
log: {{dir: {run}, every: 1}}
""")
    return path


class Agents:
    """One `dtrain launch` per host: node 0 first, the others once it listens."""

    def __init__(self, spec, n, logs):
        self.procs, self.logs, self.spec = [], [], spec
        self.env = dict(os.environ, DTRAIN_TOKEN="elastic-bench", DTRAIN_NO_REBUILD="1")
        for i in range(n):
            self.add(i, logs[i])
            if i == 0:
                wait_for(lambda: "listening on port" in read(logs[0]), 30, "node 0's rendezvous")

    def add(self, i, log):
        self.logs.append(log)
        self.procs.append(subprocess.Popen(
            ["nsenter", "--net=/run/netns/dtrain-h%d" % i, "--", DTRAIN, "launch", self.spec,
             "--node-rank", str(i), "--rdzv", addr(0) + ":29400"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def wait(self, timeout):
        return [p.wait(timeout) for p in self.procs]

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def steps_of(metrics):
    return [int(line.split('"step": ')[1].split(",")[0]) for line in read(metrics).splitlines()
            if '"step": ' in line]


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return time.monotonic()
        time.sleep(POLL_S)
    raise RuntimeError("timed out waiting for " + what)


# Times (s) from `t0` until node 0's log shows `closed` and then until
# metrics.jsonl has a line more than it had then (the round's first step).
def round_times(log0, metrics, t0, named=None):
    t = {"named": None, "formed": None, "training": None}
    lines_at_formed = 0  # the last round's workers are gone before a round closes

    def progress():
        nonlocal lines_at_formed
        text, now = read(log0), time.monotonic()
        if named and t["named"] is None and named in text:
            t["named"] = now
        if t["formed"] is None and t["closed_marker"] in text:
            t["formed"] = now
            lines_at_formed = len(steps_of(metrics))
        elif t["formed"] is not None and t["training"] is None and len(steps_of(metrics)) > lines_at_formed:
            t["training"] = now
        return all(t[key] is not None for key in ("formed", "training")) and (not named or t["named"])

    return t, progress


# The phases of one recovery, from the logs' [HH:MM:SS.mmm] stamps (agents
# and workers on this machine's clock), as seconds after the cut: when node 0
# named the lost node, the last survivor began stopping its workers, round 2
# closed, the last survivor had started its workers, the last worker was in
# main with its spec read (its fault warning: process start, library load),
# had its Gloo groups ("coordinates"), and rank 0 had restored its state
# ("resuming from step"). The first step comes from metrics.jsonl.
TIMELINE = [("named", "declared dead"), ("stopping", "stopping " if RESTART else "keeping " if IN_PLACE else "stopping |keeping "),
            ("formed", "rendezvous round 2 closed"),
            ("spawned", "round 2: node "), ("worker main", "FAULT INJECTION ON"),
            ("gloo ready", " coordinates "), ("restored", "resuming from step ")]


def stamp(line):
    if not line.startswith("[") or len(line) < 14 or line[3] != ":" or line[9] != ".":
        return None
    h, m, sec = line[1:13].split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def day_seconds(t):
    lt = time.localtime(t)
    return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + (t % 1)


def round2_section(path):
    text = read(path)
    at = text.find(", round 2, ")
    return text[at:] if at >= 0 else ""


def last_stamp(texts, needle, after):
    """The latest text's first stamped line holding needle ("a|b": either) at or after `after` (None: some text has none)."""
    found = []
    for text in texts:
        times = [stamp(l) for l in text.splitlines()
                 if any(n in l for n in needle.split("|")) and stamp(l) is not None]
        times = [x for x in times if x >= after - 0.001]
        if not times:
            return None
        found.append(min(times))
    return max(found)


def timeline(run, logs, cut_wall, training):
    cut = day_seconds(cut_wall)
    agents = [read(logs[0]), read(logs[1])]
    workers = [round2_section(os.path.join(run, "rank_%d.log" % r)) for r in (0, 1)]
    out = {}
    for name, needle in TIMELINE:  # each mark's first line after the cut (a warm spare may log before "spawned")
        texts = ([agents[0]] if name in ("named", "formed") else agents if name in ("stopping", "spawned")
                 else workers[:1] if name == "restored" else workers)  # rank 0 logs the resume
        t = last_stamp(texts, needle, cut)
        out[name] = None if t is None else t - cut
    out["first step"] = training
    return out


def one_cut(work, k):
    run = os.path.join(work, "cut%d" % k)
    logs = [os.path.join(work, "cut%d_node%d.log" % (k, i)) for i in range(3)]
    metrics = os.path.join(run, "metrics.jsonl")
    fresh_hosts()
    agents = Agents(write_spec(work, run, "2:3"), 3, logs)
    try:
        wait_for(lambda: len(steps_of(metrics)) >= 8, 180, "step 8")
        t_cut, cut_wall = time.monotonic(), time.time()
        testhosts("cut", "2")
        cut, progress = round_times(logs[0], metrics, t_cut, named="declared dead")
        cut["closed_marker"] = "rendezvous round 2 closed"
        wait_for(progress, 120, "round 2's first step")
        phases = timeline(run, logs, cut_wall, cut["training"] - t_cut)
        if len(steps_of(metrics)) >= 50:
            raise RuntimeError("round 2 ended too soon to add host 2 back; see " + logs[0])
        testhosts("heal", "2")
        t_back = time.monotonic()
        # A cut agent whose heartbeats had not yet failed 3 times when the
        # link returned is told it was dropped and re-joins itself (with
        # recover_in_place, keeping its worker): no new agent then.
        if agents.procs[2].poll() is not None:
            agents.add(2, os.path.join(work, "cut%d_node2_back.log" % k))
        back, progress = round_times(logs[0], metrics, t_back)
        back["closed_marker"] = "rendezvous round 3 closed (restart 0): 3 nodes"
        wait_for(progress, 120, "round 3's first step")
        codes = agents.wait(300)
        if codes[0] != 0 or codes[1] != 0 or codes[-1] != 0:
            raise RuntimeError("agents exited %s; see %s" % (codes, agents.logs))
        if "round 1 closed (restart 0): 3 nodes" not in read(logs[0]):
            raise RuntimeError("round 1 did not start on 3 nodes; see " + logs[0])
        resumed = [int(x.split()[0]) for x in read(logs[0]).split("resuming from step ")[1:]]
        if MEMORY and "of rank 2 from peer memory" not in read(logs[0]):
            raise RuntimeError("round 2 did not restore rank 2 from peer memory; see " + logs[0])
        return ({key: cut[key] - t_cut for key in ("named", "formed", "training")},
                {key: back[key] - t_back for key in ("formed", "training")}, resumed, phases)
    finally:
        agents.kill()


def one_fresh(work, k):
    run = os.path.join(work, "fresh%d" % k)
    logs = [os.path.join(work, "fresh%d_node%d.log" % (k, i)) for i in range(2)]
    fresh_hosts()
    t0 = time.monotonic()
    agents = Agents(write_spec(work, run, "2"), 2, logs)
    try:
        t1 = wait_for(lambda: len(steps_of(os.path.join(run, "metrics.jsonl"))) >= 1, 180, "step 1")
        if agents.wait(300) != [0, 0]:
            raise RuntimeError("fresh run failed; see %s" % logs)
        return t1 - t0
    finally:
        agents.kill()


# Each phase's median duration (from the previous mark), over the runs that have both marks.
def print_timeline(phases):
    what = {"named": "detection (missed heartbeats)", "stopping": "survivors see round 2, stop workers",
            "formed": "re-join, round 2 closes", "spawned": "agents get round 2, start workers",
            "worker main": "process start, LibTorch load, spec read", "gloo ready": "Gloo rendezvous and connect",
            "restored": "peak probe, model build, state restore", "first step": "first step (40 ms paced)"}
    print("  timeline of partition -> training again (median of each phase):")
    names = list(phases[0].keys())
    for i, name in enumerate(names):
        prev = names[i - 1] if i else None
        d = [p[name] - (p[prev] if prev else 0) for p in phases
             if p[name] is not None and (prev is None or p[prev] is not None)]
        at = [p[name] for p in phases if p[name] is not None]
        print("    %-12s at %5s s  +%5s s  %s" % (name, "%.2f" % statistics.median(at) if at else "?",
                                                 "%.2f" % statistics.median(d) if d else "?", what[name]))


def main():
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = int(numbers[0]) if numbers else 3
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces): sudo %s" % sys.argv[0])
    if not os.access(DTRAIN, os.X_OK):
        sys.exit("no %s: build first (scripts/build)" % DTRAIN)
    # The integration tests' lock on the test hosts (tests/support/test_hosts.h).
    lock = open("/run/dtrain-testhosts-test.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    work = tempfile.mkdtemp(prefix="dtrain-bench-elastic-")
    try:
        with open(os.path.join(work, "text.txt"), "w") as f:
            f.write(word_salad(64 * 1024))
        rows, grows, fresh, phases = [], [], [], []
        for k in range(runs):  # interleaved: cut, then fresh
            times, grow, resumed, phase = one_cut(work, k)
            rows.append(times)
            phases.append(phase)
            print("run %d timeline (s after the cut): %s" % (k + 1, ", ".join(
                "%s %s" % (name, "?" if t is None else "%.2f" % t) for name, t in phase.items())), flush=True)
            grows.append(grow)
            fresh.append(one_fresh(work, k))
            print("run %d: cut at step >= 8 -> named %.2f s, round 2 formed %.2f s, training again "
                  "%.2f s (from step %d); host 2 back -> round 3 formed %.2f s, training on 3 %.2f s "
                  "(from step %d); fresh 2-host start -> first step %.2f s"
                  % (k + 1, times["named"], times["formed"], times["training"], resumed[0],
                     grow["formed"], grow["training"], resumed[1], fresh[-1]), flush=True)
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        g_med = {key: statistics.median(r[key] for r in grows) for key in grows[0]}
        f_med = statistics.median(fresh)
        restart = statistics.median(r["training"] - r["formed"] for r in rows)
        print("\n3 test hosts x 1 worker, elastic 2:3, heartbeat %g s (dead after 3 missed), "
              "grace %.1f s, last call %.1f s%s; %d runs, medians:"
              % (HEARTBEAT_S, GRACE_S, LAST_CALL_S, ", checkpoint.memory every 1" if MEMORY else "", runs))
        print("  partition -> named            %.2f s  (%.1f heartbeats)" % (med["named"], med["named"] / HEARTBEAT_S))
        print("  partition -> round 2 formed   %.2f s  (named -> formed %.2f s: stop, re-join, last call)"
              % (med["formed"], med["formed"] - med["named"]))
        print("  partition -> training again   %.2f s  (formed -> first step %.2f s)" % (med["training"], restart))
        print("  node back -> round 3 formed   %.2f s  (survivors save on SIGTERM, re-join; max nodes: no last call)"
              % g_med["formed"])
        print("  node back -> training on 3    %.2f s" % g_med["training"])
        print("  peer: fresh 2-host launch -> first step %.2f s" % f_med)
        print_timeline(phases)
        print("  ratios: recovery (partition -> training) / fresh start = %.2fx; "
              "formed -> first step / fresh start = %.2fx" % (med["training"] / f_med, restart / f_med))
    finally:
        subprocess.run([TESTHOSTS, "down"], stdout=subprocess.DEVNULL)
        if os.environ.get("DTRAIN_BENCH_KEEP"):
            print("logs kept in " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
