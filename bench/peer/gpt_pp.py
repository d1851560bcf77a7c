#!/usr/bin/env python3
# A pipeline peer: gpt_ddp.py's GPT, data and optimizer, split into one stage
# per rank with torch.distributed.pipelining (PipelineStage + Schedule1F1B, or
# ScheduleGPipe; or --schedule interleaved: --virtual-stages v stages per
# rank, global stage g = chunk * ranks + rank, with ScheduleInterleaved1F1B). No data parallelism: the step's micro-batches are the
# gradient-accumulation micro-steps (m = --grad-accum, default = ranks, so the
# global batch micro_batch * m equals gpt_ddp.py's at the same rank count and
# holds the same samples). Stage 0 holds wte/wpe and the first layers/pp
# blocks, the last stage the last blocks, ln_f and head; the loss is computed
# by the schedule's loss_fn on the last stage, and gradients are the mean over
# micro-batches (scale_grads). Not here: PP x DP.
# CPU with gloo, one thread per rank; launch with the venv's torchrun:
#   $VENV/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 \
#       bench/peer/gpt_pp.py --data data/corpus.txt --layers 4
# Rank 0 prints "PEER kind=pp_1f1b tokens_per_s=<x> step_ms=<y> peak_rss_mb=<z>
# final_loss=<l> ..." (peer_common.summary) as its last line.
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from gpt_ddp import Gpt, lr_at
from peer_common import Batches, add_common_args, load_bytes, parse_args, summary


class GptStage(nn.Module):
    """Blocks [first, last) of a full Gpt, plus the embeddings on the first
    stage and ln_f + head on the last. The full model is built (and seeded)
    on every rank so each stage holds exactly gpt_ddp.py's initial numbers."""

    def __init__(self, full, first, last, is_first, is_last):
        super().__init__()
        self.is_first, self.is_last = is_first, is_last
        if is_first:
            self.wte, self.wpe = full.wte, full.wpe
        self.blocks = nn.ModuleList(full.blocks[first:last])
        if is_last:
            self.ln_f, self.head = full.ln_f, full.head

    def forward(self, x):  # first stage: tokens [B, T]; later: activations [B, T, C]
        if self.is_first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.head(self.ln_f(x))  # [B, T, V]
        return x


def loss_fn(logits, targets):  # [B, T, V], [B, T] -> mean loss of one micro-batch
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def clip_grad_norm_pp(params, max_norm):
    """clip_grad_norm_ over the whole pipeline: every stage holds different
    parameters, so the squared norms are summed over all ranks."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.stack([g.detach().pow(2).sum() for g in grads]).sum() if grads else torch.zeros(())
    dist.all_reduce(sq)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return norm


def main():
    ap = add_common_args(argparse.ArgumentParser())
    ap.add_argument("--grad-accum", type=int, default=0,
                    help="pipeline micro-batches per step (default: the number of ranks)")
    ap.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe", "interleaved"))
    ap.add_argument("--virtual-stages", type=int, default=2, help="stages per rank (--schedule interleaved)")
    a = parse_args(ap)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    v = a.virtual_stages if a.schedule == "interleaved" else 1
    if a.layers % (world * v):
        raise SystemExit(f"gpt_pp: --layers {a.layers} is not a multiple of pp x virtual stages = {world * v}")
    m = a.grad_accum or world
    T = a.seq_len
    gbs = a.micro_batch * m
    batches = Batches(load_bytes(a.data), T, a.micro_batch, gbs, a.seed)

    per = a.layers // (world * v)
    full = Gpt(a.vocab, a.layers, a.d_model, a.heads, T, a.seed)
    n = world * v
    mods = [GptStage(full, g * per, (g + 1) * per, g == 0, g == n - 1) for g in range(rank, n, world)]
    del full
    stages = [PipelineStage(mod, g, n, torch.device("cpu")) for mod, g in zip(mods, range(rank, n, world))]
    if a.schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    else:
        sched = (Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe)(stages[0], n_microbatches=m, loss_fn=loss_fn)
    is_first, is_last = any(mod.is_first for mod in mods), any(mod.is_last for mod in mods)  # of this rank's stages

    params = [p for mod in mods for p in mod.parameters()]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    t_first = first_logged = cpu_first = None
    mean = torch.zeros(())
    for step in range(a.steps):
        mbs = [batches.slot(step, i) for i in range(m)]  # micro-batch i = slot i of the step
        losses = []
        if is_first:
            sched.step(arg_mbs=[(x,) for x, _ in mbs], target_mbs=[y for _, y in mbs]
                       if is_last else None, losses=losses, return_outputs=False)
        elif is_last:
            sched.step(target_mbs=[y for _, y in mbs], losses=losses, return_outputs=False)
        else:
            sched.step(return_outputs=False)
        norm = clip_grad_norm_pp(params, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        opt.step()
        opt.zero_grad()
        done = step + 1
        if done % a.log_every == 0 or done == a.steps:
            # The last stage holds the micro-batch losses; their mean is the step's.
            mean = torch.stack([l.detach() for l in losses]).mean() if losses else torch.zeros(())
            dist.broadcast(mean, src=world - 1)
            now = time.perf_counter()
            if t_first is None:
                t_first, first_logged = now, done  # timing starts after the first interval
                cpu_first = time.process_time()  # this process's CPU, all its threads (Gloo's too)
            elif rank == 0:
                print(f"peer step {done}/{a.steps} loss {mean.item():.4f} grad_norm {norm.item():.3f}",
                      flush=True)
    t_end = time.perf_counter()
    cpu_ms = 1e3 * (time.process_time() - cpu_first) / (a.steps - first_logged)
    summary(f"pp_{a.schedule}", a, gbs * T, a.steps - first_logged, t_end - t_first, mean.item(),
            f"gbs={gbs} microbatches={m} stages={world} virtual_stages={v} rank0_cpu_ms_per_step={cpu_ms:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
