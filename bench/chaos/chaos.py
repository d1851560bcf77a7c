#!/usr/bin/env python3
"""Chaos campaign: runs an elastic dtrain job on N test hosts (scripts/testhosts)
while injecting faults drawn from a seeded schedule, and reports per fault the
time to detect it, the time to train again, the steps redone and the cause the
agents named; at the end goodput, and that nothing was lost (every redone
step's loss equals its first run, every step ran, no process left in the
hosts). Drives the real binaries; Python standard library only.

  bench/chaos/chaos.py --dtrain build/apps/dtrain/dtrain --seed 7 --faults 8 --out /tmp/chaos
  (--duration S instead of --faults: inject until S seconds have passed)

Faults: kill_worker (SIGKILL a worker), kill_agent (SIGKILL an agent; it is
started again once the survivors re-formed), hang (SIGSTOP a worker: the
rendezvous' hang detection names it), slow_rank (stopped 40 ms of every
60 ms for 2 s by default: named in metrics.jsonl as slowest_rank; nothing is redone), link_cut (host's
link down, up again a few seconds later: the agent re-joins), full_disk
(checkpoint.dir is a small tmpfs; it is filled until a save fails on it, then
freed), corrupt_ckpt (a worker SIGKILLed, then the newest checkpoint's files
corrupted before the restart reads them: the restart skips it, naming it, and
resumes from the newest step that verifies). With --replay, the final
parameters must also equal a fault-free replay of the run's membership
changes (chaos_replay.py; --replay-control adds its negative control). Exit 0
when every check passed, 1 otherwise; results in <out>/chaos.md, chaos.json,
chaos.svg.
"""
import argparse
import fcntl
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

from chaos_faults import FaultInjector, addr, netns_pids
from chaos_replay import check_replay, merge_ckpt
from chaos_report import LOSS_TOL, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
TESTHOSTS = os.path.join(SOURCE, "scripts", "testhosts")
KINDS = ["kill_worker", "kill_agent", "hang", "slow_rank", "link_cut", "full_disk", "corrupt_ckpt"]
RDZV_PORT = 29400
# The agents' first word on any fault: a worker's failure, a round change's
# reason, a lost node, a hang, a skipped checkpoint (or one found corrupt
# after a restore from memory), a full disk.
ANY_CAUSE = (r"because: [^\n]*|failed: [^\n]*|lost node [^\n]*|hang: [^\n]*|checkpoint: skipped[^\n]*|"
             r"checkpoint: step_\d+ does not verify[^\n]*|"
             r"No space left on device")


def word_salad(size, seed=1):
    words = ["the ", "model ", "learns ", "a ", "distributed ", "gradient ", "bucket ", "of ", "bytes ",
             "and ", "every ", "rank ", "sums ", "its ", "share\n", "while ", "backward ", "runs. "]
    rng = random.Random(seed)
    out = []
    n = 0
    while n < size:
        w = rng.choice(words)
        out.append(w)
        n += len(w)
    return "".join(out)[:size]


class Metrics:
    """Follows <run>/metrics.jsonl: every step record with the wall time it was
    seen and the byte offset its line starts at (records past the file's size
    at some moment were written after it, whenever the reader saw them)."""

    def __init__(self, path):
        self.path = path
        self.records = []  # (seen_at, step, loss, slowest_rank, step_time_s, straggler_ratio, offset)
        self.ckpt = []  # (seen_at, step, ckpt_block_ms): the step loop stopped for a save or copy
        self.lock = threading.Lock()
        self.offset = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        pending = b""
        line_at = 0  # the file offset of pending's first byte
        while not self.stop:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    chunk = f.read()
                    self.offset = f.tell()
            except OSError:
                chunk = b""
            pending += chunk
            now = time.time()
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                start, line_at = line_at, line_at + len(line) + 1
                try:
                    r = json.loads(line.decode(errors="replace"))
                except ValueError:
                    continue
                if "ckpt_block_ms" in r and "step" in r:
                    with self.lock:
                        self.ckpt.append((now, int(r["step"]), float(r["ckpt_block_ms"])))
                if "loss" not in r or "step" not in r:
                    continue
                with self.lock:
                    self.records.append((now, int(r["step"]), float(r["loss"]), r.get("slowest_rank"),
                                         float(r.get("step_time_s", 0.0)), float(r.get("straggler_ratio") or 0),
                                         start))
            time.sleep(0.05)

    def size(self):
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def snapshot(self):
        with self.lock:
            return list(self.records)

    def max_step(self):
        recs = self.snapshot()
        return max((r[1] for r in recs), default=0)


class Agent:
    def __init__(self, campaign, i, k):
        self.i, self.k = i, k
        self.log_path = os.path.join(campaign.out, "agent%d_%d.log" % (i, k))
        self.log = open(self.log_path, "w")
        argv = ["/usr/bin/nsenter", "--net=/run/netns/dtrain-h%d" % i, "--", campaign.dtrain, "launch",
                campaign.spec, "--node-rank", str(i), "--rdzv", "%s:%d" % (addr(0), RDZV_PORT)]
        env = dict(os.environ, DTRAIN_TOKEN="chaos-campaign", DTRAIN_NO_REBUILD="1")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def ckpt_extra(a):
    """The spec's checkpoint options past dir/every/keep: async saves, in-memory copies."""
    out = ", async: true" if a.ckpt_async else ""
    if a.memory_every:
        out += ", memory: {every: %d, replicas: %d}" % (a.memory_every, a.memory_replicas)
    return out


class Campaign(FaultInjector):
    def __init__(self, a):
        self.a = a
        self.dtrain = os.path.abspath(a.dtrain)
        self.out = os.path.abspath(a.out)
        os.makedirs(self.out, exist_ok=True)
        self.run_dir = os.path.join(self.out, "run")
        self.ckpt_dir = os.path.join(self.run_dir, "ckpt")  # a small tmpfs: the full_disk fault fills it
        self.mounted = False
        self.spec = os.path.join(self.out, "spec.yaml")
        self.rng = random.Random(a.seed)
        self.agents = {}  # host -> current Agent
        self.all_agents = []
        self.faults = []
        self.problems = []
        self.t0 = time.time()
        self.seen_pids = set()  # every process seen in the hosts: their /dev/shm segments must be gone

    # ---- set-up -------------------------------------------------------------
    def write_spec(self):
        a = self.a
        with open(os.path.join(self.out, "text.txt"), "w") as f:
            f.write(word_salad(64 * 1024))
        n = a.hosts
        # Steps of ~0.1 s on a CPU from the model's size alone: a `fault: slow`
        # pacing would stop at the first restart (it acts on restart 0 only).
        spec = (
            "job: {name: chaos, seed: 1234}\n"
            "cluster: {nodes: \"%d:%d\", procs_per_node: 1, device: cpu, backend: gloo, max_restarts: 1000,\n"
            "          grace_s: 1, hang_timeout_s: %g%s,\n"
            "          rendezvous: {join_timeout_s: 30, last_call_s: 1, heartbeat_s: 0.5, rejoin_timeout_s: 120}}\n"
            "parallel: {dp: auto}\n"
            "model: {kind: gpt, vocab: 256, layers: 2, d_model: %d, heads: 2, seq_len: 64, dropout: 0.0}\n"
            "train: {steps: %d, micro_batch: 2, global_batch: 12, grad_accum: auto, lr: 3.0e-3,\n"
            "        warmup_steps: 3, precision: fp32}\n"
            "data: {path: %s, format: bytes}\n"
            "checkpoint: {dir: %s, every: %d, keep: 3%s}\n"
            "log: {dir: %s, every: 1}\n"
            "entrypoint: builtin\n"
        ) % (max(1, n - 1), n, a.hang_timeout_s,
             (", hang_timeout_steps: %g" % a.hang_timeout_steps if a.hang_timeout_steps > 0 else "") +
             (", recover_in_place: true" if a.in_place else ""), a.d_model, a.steps, os.path.join(self.out, "text.txt"),
             self.ckpt_dir, a.ckpt_every, ckpt_extra(a), self.run_dir)
        with open(self.spec, "w") as f:
            f.write(spec)
        os.makedirs(self.ckpt_dir, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % a.ckpt_fs_mb, "dtrain-chaos", self.ckpt_dir],
                       check=True)
        self.mounted = True

    def start_agent(self, i):
        k = sum(1 for ag in self.all_agents if ag.i == i)
        ag = Agent(self, i, k)
        self.agents[i] = ag
        self.all_agents.append(ag)
        return ag

    def node0_text(self):
        return self.agents[0].text()

    def all_text(self):
        return "\n".join(ag.text() for ag in self.all_agents)

    def marks(self):
        """Where each agent's log ends now: new_text() reads from there."""
        return {ag.log_path: len(ag.text()) for ag in self.all_agents}

    def new_text(self, marks):
        return "\n".join(ag.text()[marks.get(ag.log_path, 0):] for ag in self.all_agents)

    def elapsed(self, t=None):
        return (t if t is not None else time.time()) - self.t0

    # ---- waiting ------------------------------------------------------------
    def wait(self, pred, timeout, what):
        end = time.time() + timeout
        while time.time() < end:
            v = pred()
            if v:
                return v
            if self.agents[0].proc.poll() is not None:
                break
            time.sleep(0.05)
        v = pred()
        if not v:
            self.problems.append("timed out after %g s waiting for %s" % (timeout, what))
        return v

    def last_round(self):
        rounds = re.findall(r"rendezvous round (\d+) closed \(restart \d+\): (\d+) nodes", self.node0_text())
        return (int(rounds[-1][0]), int(rounds[-1][1])) if rounds else (0, 0)

    def collect_pids(self):
        while not getattr(self, "t_end", None):
            for i in range(self.a.hosts):
                self.seen_pids.update(netns_pids(i))
            time.sleep(0.2)

    def healthy(self):
        """All hosts in the last round and two steps recorded after it closed."""
        self.track_rounds()
        rnd, nodes = self.last_round()
        return nodes == self.a.hosts and rnd in self.round_at and len(self.records_after(self.round_at[rnd])) >= 2

    def records_after(self, offset):
        """Step records written after metrics.jsonl had `offset` bytes."""
        return [r for r in self.metrics.snapshot() if r[6] >= offset]

    def track_rounds(self):
        """Notes metrics.jsonl's size when a round's close is first seen: the
        round's workers have not started then (the old round's rank 0 was
        reaped before the round could close), so a record past it is theirs."""
        rnd, _ = self.last_round()
        if rnd and rnd not in self.round_at:
            self.round_at[rnd] = self.metrics.size()
            self.round_seen[rnd] = time.time()

    def trained_after_round(self, rnd):
        """The first step record of a round after `rnd` (None: none yet)."""
        self.track_rounds()
        later = [at for r, at in self.round_at.items() if r > rnd]
        recs = self.records_after(min(later)) if later else []
        return recs[0] if recs else None

    # ---- faults -------------------------------------------------------------
    def follow(self, f):
        """Waits for the fault to be named and training to resume; fills f."""
        if f["kind"] == "corrupt_ckpt":
            self.corrupt_latest(f)
        pattern, _ = self.detect_pattern(f)
        limit = self.a.recover_timeout_s
        if pattern is None:  # slow_rank: named by metrics.jsonl's slowest_rank and straggler_ratio
            rank_recs = self.wait(lambda: [r for r in self.records_after(f["metrics_at"])
                                           if r[5] >= self.a.straggler_ratio], limit,
                                  "a straggler step")
            f["detected"] = rank_recs[0][0] if rank_recs else None
            f["named"] = ("slowest_rank %s, straggler_ratio %.1f" % (rank_recs[0][3], rank_recs[0][5])
                          if rank_recs else "not named")
            f["trained"] = f["detected"]
            f["redone"] = 0
            f["correct"] = bool(rank_recs)
            return
        def named():  # the first sign that something is wrong, whatever it says
            m = re.search(pattern, self.new_text(f["mark"])) or re.search(ANY_CAUSE, self.new_text(f["mark"]))
            return m.group(0) if m else None
        got = self.wait(named, limit, "%s on host %d to be detected" % (f["kind"], f["host"]))
        f["detected"] = time.time() if got else None
        f["named"] = got or "not detected"
        if f["kind"] == "full_disk" and got:
            os.remove(os.path.join(self.ckpt_dir, "filler"))
            f["freed"] = time.time()
        if f["kind"] == "link_cut":
            time.sleep(max(0.0, f["at"] + self.a.cut_s - time.time()))  # the partition lasts cut_s
            subprocess.run([TESTHOSTS, "heal", str(f["host"])], check=True, capture_output=True)
            f["healed"] = time.time()
        if f["kind"] == "kill_agent" and got:
            # Start it again once the survivors have re-formed without it.
            self.wait(lambda: self.last_round()[1] == self.a.hosts - 1, limit, "the survivors to re-form")
            self.start_agent(f["host"])
        if f["kind"] == "full_disk" and got and re.search(r"No space left on device; training goes on",
                                                          self.new_text(f["mark"])):
            # The save failed and training never stopped (an I/O failure of an
            # async save, fewer than 3 in a row): no round change to wait for.
            f["trained"], f["redone"], f["correct"], f["no_stop"] = f["detected"], 0, True, True
            return
        # Training again: a step of a round after the fault's (a record seen
        # after the detection may have been written before the failure).
        first = self.wait(lambda: self.trained_after_round(f["round"]), limit,
                          "training after %s on host %d" % (f["kind"], f["host"]))
        f["trained"] = first[0] if first else None
        if first:
            before = [r[1] for r in self.metrics.snapshot() if r[6] < first[6]]  # the failed round's
            top = max(before, default=0)
            f["redone"] = max(0, top - (first[1] - 1))
        # Named correctly: the fault's own explanation appeared (by the time
        # training resumed), not only a consequence of it.
        m = re.search(pattern, self.new_text(f["mark"]))
        f["correct"] = bool(m)
        if m:
            f["named"] = m.group(0)
        if f["kind"] == "link_cut":
            # Back in a round of all hosts: through the re-join (its agent had
            # given the round up) or a plain round change (its link returned first).
            back = self.wait(lambda: self.last_round()[1] == self.a.hosts and self.last_round()[0] > f["round"],
                             limit, "host %d to be back in a round of %d nodes" % (f["host"], self.a.hosts))
            m = re.search(r"re-joined the rendezvous [0-9.]+ s after losing it", self.new_text(f["mark"]))
            f["named"] += "; back in round %d %s" % (self.last_round()[0], "(" + m.group(0) + ")" if m else
                                                       "(its agent re-joined on the round change)") if back else \
                "; not back"

    def schedule(self):
        kinds = []
        while len(kinds) < 10000:
            batch = list(self.a.kinds)
            self.rng.shuffle(batch)
            kinds += batch
        for kind in kinds:
            hosts = list(range(1, self.a.hosts)) if kind in ("kill_agent", "link_cut") else list(range(self.a.hosts))
            yield kind, self.rng.choice(hosts), self.rng.uniform(0.5, 1.5) * self.a.every_s

    # ---- the campaign -------------------------------------------------------
    def run(self):
        self.write_spec()
        self.metrics = Metrics(os.path.join(self.run_dir, "metrics.jsonl"))
        self.round_seen = {}  # round -> when its close was first seen
        self.round_at = {}  # round -> metrics.jsonl's size then
        threading.Thread(target=self.collect_pids, daemon=True).start()
        self.start_agent(0)
        self.wait(lambda: "listening on port" in self.node0_text(), 60, "node 0's rendezvous")
        for i in range(1, self.a.hosts):
            self.start_agent(i)
        for kind, host, gap in self.schedule():
            if self.a.faults and len(self.faults) >= self.a.faults:
                break
            if self.a.duration_s and self.elapsed() >= self.a.duration_s:
                break
            ready = self.wait(self.healthy, 120, "all hosts training")
            if not ready:
                if self.agents[0].proc.poll() is not None:
                    self.problems.append("the job ended (step %d) before fault %d: raise --steps"
                                         % (self.metrics.max_step(), len(self.faults) + 1))
                break
            if self.a.interval_s:  # a fault every interval_s from one injection to the next
                last = self.faults[-1]["at"] if self.faults else self.t0
                gap = max(0.0, last + self.a.interval_s - time.time())
            time.sleep(gap)  # the schedule's spacing between faults (not a synchronisation)
            if self.metrics.max_step() >= self.a.steps - self.a.margin_steps:
                self.problems.append("the job reached step %d before fault %d: raise --steps"
                                     % (self.metrics.max_step(), len(self.faults) + 1))
                break
            f = self.inject(kind, host)
            if f is None:
                continue
            self.faults.append(f)
            print("chaos: %6.1f s  %-11s host %d (step %d)" % (self.elapsed(f["at"]), kind, host, f["step_at"]),
                  flush=True)
            self.follow(f)
        if self.a.end == "signal":
            # Train a few more steps, then end the job as a preemption would:
            # SIGTERM to every agent (workers finish the step, save, exit 0).
            top = self.metrics.max_step()
            self.wait(lambda: self.metrics.max_step() >= top + 5, self.a.recover_timeout_s, "steps after the last fault")
            for ag in self.agents.values():
                if ag.proc.poll() is None:
                    os.kill(ag.proc.pid, signal.SIGTERM)
        self.finish()

    def finish(self):
        end = time.time() + self.a.end_timeout_s
        for ag in self.all_agents:
            left = max(1.0, end - time.time())
            try:
                ag.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                self.problems.append("agent on host %d (log %s) still running at the end" % (ag.i, ag.log_path))
        self.t_end = time.time()
        time.sleep(0.5)
        self.metrics.stop = True
        self.metrics.thread.join()
        current = [self.agents[i] for i in sorted(self.agents)]
        ok_codes = (0, 128 + signal.SIGTERM) if self.a.end == "signal" else (0,)
        for ag in current:
            if ag.proc.poll() not in ok_codes:
                self.problems.append("agent on host %d exited %s (log %s)" % (ag.i, ag.proc.poll(), ag.log_path))
        self.kill_leftovers()

    def kill_leftovers(self):
        left = []
        deadline = time.time() + 10
        while time.time() < deadline:
            left = [p for i in range(self.a.hosts) for p in netns_pids(i)]
            if not left:
                break
            time.sleep(0.1)
        if left:
            self.problems.append("processes left in the hosts: %s" % left)
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        for ag in self.all_agents:
            if ag.proc.poll() is None:
                os.killpg(ag.proc.pid, signal.SIGKILL)
                ag.proc.wait()


def checks(c, shm_before):
    """Nothing lost: every step ran, each redone step's loss equals its first run."""
    recs = c.metrics.snapshot()
    first = {}
    worst = 0.0
    worst_step = None
    for r in recs:
        step, loss = r[1], r[2]
        if step not in first:
            first[step] = loss
            continue
        d = abs(loss - first[step]) / max(abs(first[step]), 1e-12)
        if d > worst:
            worst, worst_step = d, step
    last = max(first, default=0) if c.a.end == "signal" else c.a.steps
    missing = [s for s in range(1, last + 1) if s not in first]
    redone = len(recs) - len(first)
    if missing:
        c.problems.append("steps never trained: %s" % missing[:20])
    if worst > LOSS_TOL:
        c.problems.append("step %d's redone loss differs from its first run by %.3g (tolerance %g)"
                          % (worst_step, worst, LOSS_TOL))
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # dtrain's segments are /dev/shm/dtrain-<pid>-<nonce>, an agent's in-memory copies
    # /dev/shm/dtrain-mem-<job>-<address>_<agent pid>: those of this job's processes.
    def ours(name):
        m = re.match(r"dtrain-(\d+)-", name) or re.match(r"dtrain-mem-chaos-.*_(\d+)$", name)
        return m and int(m.group(1)) in c.seen_pids
    new_shm = sorted(n for n in shm_after - shm_before if ours(n))
    if new_shm:
        c.problems.append("/dev/shm segments left: %s" % new_shm)
    for f in c.faults:
        if f.get("detected") is None or f.get("trained") is None:
            c.problems.append("fault %s on host %d: not %s" % (f["kind"], f["host"],
                              "named" if f.get("detected") is None else "recovered from"))
    wall = c.t_end - c.t0
    seen, productive = set(), 0.0
    for r in recs:
        if r[1] not in seen:
            seen.add(r[1])
            productive += r[4]
    goodput_json = None
    try:
        with open(os.path.join(c.run_dir, "goodput.json")) as f:
            goodput_json = json.load(f)
    except (OSError, ValueError):
        pass
    # Rounds the rendezvous opened on a hang (each agent logs each round once), against the hangs
    # injected: more means a hang named where none was injected, or a fault first named as one.
    hang_rounds = set(re.findall(r"round (\d+) opens: hang in round", "\n".join(ag.text() for ag in c.all_agents)))
    return {"max_redo_loss_rel_diff": worst, "redone_records": redone, "missing_steps": missing,
            "wall_s": wall, "productive_s": productive, "goodput": productive / wall if wall > 0 else 0,
            "new_shm": new_shm, "goodput_json": goodput_json, "hang_rounds": len(hang_rounds),
            "hang_faults": sum(1 for f in c.faults if f["kind"] == "hang")}


def keep_final(c):
    """The campaign's final checkpoint as one file of parameters: (step, path) or None."""
    try:
        with open(os.path.join(c.ckpt_dir, "latest")) as f:
            step = int(f.read().strip().split("_")[1])
    except (OSError, ValueError, IndexError) as e:
        c.problems.append("replay: no final checkpoint in %s (%s)" % (c.ckpt_dir, e))
        return None
    out = os.path.join(c.out, "final.merged.safetensors")
    err = merge_ckpt(c.dtrain, c.ckpt_dir, out)
    if err:
        c.problems.append("replay: " + err)
        return None
    return step, out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtrain", default=os.path.join(SOURCE, "build", "apps", "dtrain", "dtrain"))
    p.add_argument("--out", required=True)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--faults", type=int, default=0, help="stop after this many faults (0: --duration)")
    p.add_argument("--duration-s", type=float, default=0)
    p.add_argument("--every-s", type=float, default=3.0, help="mean gap between a recovery and the next fault")
    p.add_argument("--interval-s", type=float, default=0,
                   help="a fault every S seconds, injection to injection (instead of --every-s; a fault still "
                        "waits until every host trains again)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--margin-steps", type=int, default=20, help="no fault this close to the last step")
    p.add_argument("--end", choices=["steps", "signal"], default="steps",
                   help="steps: the job runs to train.steps; signal: SIGTERM to the agents 5 steps after "
                        "the last fault's recovery (every step up to the last one run must be there)")
    p.add_argument("--d-model", type=int, default=96, help="model width: sets the step time")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--async", dest="ckpt_async", action="store_true",
                   help="checkpoint.async: true (a background writer persists each save)")
    p.add_argument("--memory-every", type=int, default=0,
                   help="checkpoint.memory.every: in-memory copies in a peer node's RAM every S steps (0: off)")
    p.add_argument("--memory-replicas", type=int, default=1, help="checkpoint.memory.replicas")
    p.add_argument("--in-place", action="store_true",
                   help="cluster.recover_in_place: survivors keep their workers across a round change")
    p.add_argument("--hang-timeout-s", type=float, default=3)
    p.add_argument("--hang-timeout-steps", type=float, default=0,
                   help="cluster.hang_timeout_steps: a hang after this many of the slowest step (0: off)")
    p.add_argument("--ckpt-fs-mb", type=int, default=48, help="size of the tmpfs under checkpoint.dir")
    p.add_argument("--slow-s", type=float, default=2.0)
    p.add_argument("--slow-stop-ms", type=float, default=40,
                   help="slow_rank: stopped this many ms of every 60 ms (40: about 3x slower; with ranks that "
                        "share cores the others speed up, so longer steps need more)")
    p.add_argument("--kinds", default=",".join(KINDS), type=lambda v: v.split(","),
                   help="the fault kinds drawn, comma-separated (default: all)")
    p.add_argument("--straggler-ratio", type=float, default=3.0, help="a slow_rank is named at this ratio")
    p.add_argument("--cut-s", type=float, default=3.0)
    p.add_argument("--recover-timeout-s", type=float, default=90)
    p.add_argument("--end-timeout-s", type=float, default=300)
    p.add_argument("--replay", action="store_true",
                   help="check the final parameters against a fault-free replay of the same membership changes")
    p.add_argument("--replay-control", action="store_true",
                   help="with --replay: also the negative control (one segment trains another global batch)")
    p.add_argument("--replay-each-restart", action="store_true",
                   help="with --replay: one replay segment per restart, not per membership change")
    p.add_argument("--hosts-ready", action="store_true",
                   help="the caller holds the test hosts (scripts/testhosts up N done)")
    a = p.parse_args()
    if not a.faults and not a.duration_s:
        p.error("give --faults or --duration-s")
    if not a.kinds or any(k not in KINDS for k in a.kinds):
        p.error("--kinds: each of %s" % ", ".join(KINDS))
    if not 0 < a.slow_stop_ms < 60:
        p.error("--slow-stop-ms: between 0 and 60 (ms of every 60 ms)")
    if a.memory_every < 0 or a.memory_replicas < 1:
        p.error("--memory-every: 0 (off) or more; --memory-replicas: 1 or more")
    lock = None
    if not a.hosts_ready:
        lock = open("/run/dtrain-testhosts-test.lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)  # the tests' lock: one user of the hosts at a time
        subprocess.run([TESTHOSTS, "up", str(a.hosts)], check=True)
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    c = Campaign(a)
    final = None  # (step, merged parameters) of the campaign's last checkpoint, for --replay
    try:
        c.run()
    finally:
        if c.all_agents and not hasattr(c, "t_end"):
            c.t_end = time.time()
            c.kill_leftovers()
        if c.mounted and a.replay:  # checkpoint.dir is a tmpfs: read its last step before it goes
            final = keep_final(c)
        if c.mounted:
            subprocess.run(["umount", c.ckpt_dir], check=False)
        if not a.hosts_ready:
            subprocess.run([TESTHOSTS, "down"], check=False)
    summary = checks(c, shm_before)
    if final:
        summary.update(check_replay(c, *final))
    print(write_results(c, summary))
    return 0 if not c.problems else 1


if __name__ == "__main__":
    sys.exit(main())
