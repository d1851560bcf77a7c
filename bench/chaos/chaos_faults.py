"""The chaos campaign's fault injectors (chaos.py's Campaign mixes them in):
how each fault kind is made on the test hosts, and the text the agents print
when they name it. Python standard library only."""
import os
import re
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTHOSTS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "testhosts")


def addr(i):
    return "10.251.77.%d" % (10 + i)


def netns_pids(i):
    out = subprocess.run(["ip", "netns", "pids", "dtrain-h%d" % i], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def is_worker(pid):
    args = cmdline(pid)
    return bool(args) and os.path.basename(args[0].decode(errors="replace")) == "dtrain-worker"


def idle_spare(pid):
    """A warm spare waiting for its rank: its main thread blocks in read(0, ...)
    (/proc/PID/syscall: number 0 on x86-64, first argument fd 0). A worker that
    trains never reads stdin on its main thread (in place, a watcher thread does)."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            fields = f.read().split()
    except OSError:
        return False
    return len(fields) >= 2 and fields[0] == "0" and int(fields[1], 16) == 0


def fill(path):
    """Fills the file system holding path (ENOSPC is the point)."""
    block = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        try:
            while True:
                f.write(block)
        except OSError:
            pass
    return path


class FaultInjector:
    """Needs from its host class: a (the arguments), agents, ckpt_dir,
    metrics, marks(), last_round(), wait() and new_text()."""

    def worker_of(self, i):
        """The host's training worker, not an idle warm spare (which has the same
        name: killing one stops no training, so no fault would be named)."""
        pids = [p for p in netns_pids(i) if is_worker(p) and not idle_spare(p)]
        return pids[0] if pids else None

    def throttle(self, pid):
        """A slow rank: stopped slow_stop_ms of every 60 ms for slow_s seconds
        (below hang_timeout_s). The engine measures a rank's compute as its step
        time minus its time blocked in collectives, so one long stop that lands
        inside a collective is invisible; many short ones land in compute."""
        end = time.time() + self.a.slow_s
        stop_s = self.a.slow_stop_ms / 1000.0
        try:
            while time.time() < end:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stop_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.06 - stop_s)
        except ProcessLookupError:
            pass

    def inject(self, kind, host):
        f = {"kind": kind, "host": host, "at": time.time(), "step_at": self.metrics.max_step(),
             "mark": self.marks(), "round": self.last_round()[0],
             "metrics_at": self.metrics.size()}
        if kind in ("kill_worker", "hang", "slow_rank"):
            pid = self.worker_of(host)
            if pid is None:
                return None
            f["pid"] = pid
            if kind == "slow_rank":
                self.throttle(pid)
            else:
                os.kill(pid, signal.SIGKILL if kind == "kill_worker" else signal.SIGSTOP)
        elif kind == "kill_agent":
            ag = self.agents[host]
            f["pid"] = ag.proc.pid
            os.kill(ag.proc.pid, signal.SIGKILL)
        elif kind == "link_cut":
            subprocess.run([TESTHOSTS, "cut", str(host)], check=True, capture_output=True)
        elif kind == "full_disk":
            fill(os.path.join(self.ckpt_dir, "filler"))
        elif kind == "corrupt_ckpt":
            pid = self.worker_of(host)
            # Only with an older step to fall back to: with `latest` alone,
            # no checkpoint verifies and every restart fails the same way.
            if pid is None or len(self.ckpt_steps()) < 2:
                return None
            f["pid"] = pid
            os.kill(pid, signal.SIGKILL)
        return f

    def ckpt_steps(self):
        try:
            return [n for n in os.listdir(self.ckpt_dir) if re.fullmatch(r"step_\d+", n)]
        except OSError:
            return []

    def detect_pattern(self, f):
        h = f["host"]
        if f["kind"] == "kill_worker":
            return r"pid %d\) failed: signal 9" % f["pid"], "worker SIGKILLed"
        if f["kind"] == "hang":
            # The rendezvous' hang report: it names the rank that never
            # entered the collective, or says every rank is inside it (the
            # stopped worker had entered it before it stopped); a worker
            # stopped in start-up is named for never entering a first one.
            return r"hang: [^\n]*(\n  [^\n]*)*", "hang"
        if f["kind"] == "full_disk":
            return r"[^\n]*No space left on device", "full disk"
        if f["kind"] == "corrupt_ckpt":
            # A restart from disk skips it; one from the nodes' memory
            # (newer) verifies it after, in the background, and names it.
            return r"checkpoint: (skipped step_\d+: |step_\d+ does not verify: )[^\n]*", "corrupt checkpoint"
        if f["kind"] in ("kill_agent", "link_cut"):  # the node rank may differ from the host's index
            return r"lost node \d+: id '%s:" % re.escape(addr(h)), "lost node"
        return None, None

    def corrupt_latest(self, f):
        """After the SIGKILL is named: corrupt `latest`'s files (the restart has not read them yet)."""
        ok = self.wait(lambda: re.search(r"pid %d\) failed: signal 9" % f["pid"], self.new_text(f["mark"])),
                       self.a.recover_timeout_s, "the SIGKILL before corrupting the checkpoint")
        if not ok:
            return
        with open(os.path.join(self.ckpt_dir, "latest")) as fh:
            step_dir = os.path.join(self.ckpt_dir, fh.read().strip())
        for name in os.listdir(step_dir):
            if name.endswith(".safetensors"):
                with open(os.path.join(step_dir, name), "r+b") as fh:
                    fh.seek(-1, os.SEEK_END)
                    b = fh.read(1)
                    fh.seek(-1, os.SEEK_END)
                    fh.write(bytes([b[0] ^ 0x5A]))  # tensor data, not the header: the checksum breaks
        f["corrupted"] = os.path.basename(step_dir)
