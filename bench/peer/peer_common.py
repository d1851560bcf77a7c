# What the bench/peer scripts share besides the GPT (which lives in gpt_ddp.py):
# the common flags, the byte data, which samples form a step, the LR schedule's
# inputs and the one machine-readable summary line. The training loops (DDP,
# FSDP2, pipelining) stay in each peer; nothing here talks to a process group
# except the summary's one all-reduce.
import argparse
import resource

import torch
import torch.distributed as dist


def add_common_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags every peer takes, with gpt_ddp.py's defaults."""
    ap.add_argument("--data", default="data/corpus.txt")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    return ap


def parse_args(ap: argparse.ArgumentParser):
    """Parses; timing starts at the first logged step, so later steps must exist."""
    a = ap.parse_args()
    if a.steps <= a.log_every:
        ap.error(f"--steps {a.steps} must exceed --log-every {a.log_every} (timing starts at the first log)")
    return a


def load_bytes(path):
    """The corpus as one long tensor of byte tokens, [N]."""
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).to(torch.long)


class Batches:
    """Which samples form a step, as in gpt_ddp.py and the engine's sampler:
    one seeded permutation of the T-token windows; step s takes the GBS samples
    from s * GBS on, and slot k of the step (a DP rank, or a pipeline
    micro-batch) takes micro_batch of them from s * GBS + k * micro_batch.
    So the same samples form a step whoever computes them."""

    def __init__(self, data, seq_len, micro_batch, gbs, seed):
        self.data, self.T, self.mb, self.gbs = data, seq_len, micro_batch, gbs
        self.num_samples = (data.numel() - 1) // seq_len
        self.perm = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(seed))
        self.offsets = torch.arange(seq_len + 1)

    def slot(self, step, k):
        """(inputs, targets) of slot k of step, each [micro_batch, T]."""
        start = (step * self.gbs + k * self.mb) % (self.num_samples - self.mb)
        ids = self.perm[start:start + self.mb]
        windows = self.data[(ids * self.T).unsqueeze(1) + self.offsets]  # [B, T+1]
        return windows[:, :-1], windows[:, 1:]


def peak_rss_mb():
    """This process's peak resident set size in MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb():
    """This process's resident set size now, in MiB (VmRSS), 0 where /proc lacks it."""
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024.0
    except (OSError, StopIteration):
        return 0.0


# Resident size once torch is imported, before any model or data: most of a
# small run's peak is the wheel's libraries, so summary() prints this too.
BASE_RSS_MB = current_rss_mb()


def summary(kind, a, tokens_per_step, steps_timed, seconds, final_loss, extra=""):
    """All ranks call this after training; rank 0 prints one line that
    bench scripts grep: "PEER kind=<k> tokens_per_s=<x> step_ms=<y>
    peak_rss_mb=<max over ranks> rank0_rss_mb=<z> base_rss_mb=<rank 0's after
    import torch> final_loss=<l> ...". final_loss must be the global mean loss
    of the last step on every rank."""
    rss = torch.tensor([peak_rss_mb()], dtype=torch.float64)
    rss_max = rss.clone()
    dist.all_reduce(rss_max, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"PEER kind={kind} tokens_per_s={tokens_per_step * steps_timed / seconds:.1f} "
              f"step_ms={1e3 * seconds / steps_timed:.2f} peak_rss_mb={rss_max.item():.1f} "
              f"rank0_rss_mb={rss.item():.1f} base_rss_mb={BASE_RSS_MB:.1f} final_loss={final_loss:.6f} "
              f"ranks={dist.get_world_size()} tokens_per_step={tokens_per_step} seq_len={a.seq_len} "
              f"steps={a.steps} steps_timed={steps_timed} threads={torch.get_num_threads()} "
              f"torch={torch.__version__}{(' ' + extra) if extra else ''}", flush=True)
