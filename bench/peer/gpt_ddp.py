#!/usr/bin/env python3
# The peer for bench/peer_ratio.sh: the same GPT as engine/model/gpt.cpp (same
# sizes, registration order, seeded init, explicit masked-softmax attention,
# exact GELU, untied head), the same byte data and batch, trained with
# torch.nn.parallel.DistributedDataParallel on gloo, one thread per rank.
# Launch with the venv's torchrun (VENV = $DTRAIN_VENV, default
# ~/.cache/dtrain/torch-2.15.0, made by scripts/install-deps):
#   $VENV/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 \
#       bench/peer/gpt_ddp.py --data data/corpus.txt
# Rank 0 prints "PEER kind=ddp tokens_per_s=<x> step_ms=<y> peak_rss_mb=<z>
# final_loss=<l> ..." (peer_common.summary) as its last line. The FSDP2 and
# pipelining peers (gpt_fsdp.py, gpt_pp.py) import the GPT from here.
import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from peer_common import Batches, add_common_args, load_bytes, parse_args, summary


class CausalSelfAttention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.heads = heads

    def forward(self, x):  # [B, T, C] -> [B, T, C]
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.attn = CausalSelfAttention(c, heads)
        self.ln2 = nn.LayerNorm(c)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, layers, c, heads, seq_len, seed):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq_len, c)
        self.blocks = nn.ModuleList([Block(c, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        # gpt.cpp's init: one generator, parameters in registration order.
        gen = torch.Generator().manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2.0 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif name.startswith("ln_f.") or ".ln1." in name or ".ln2." in name:
                    p.fill_(1.0)
                elif name.endswith("proj.weight"):
                    p.normal_(0.0, proj_std, generator=gen)
                else:
                    p.normal_(0.0, 0.02, generator=gen)

    def forward(self, tokens, targets):  # [B, T] -> mean loss
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # [B, T, V]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(step, a):
    if a.warmup_steps > 0 and step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    span = a.steps - a.warmup_steps - 1
    if span <= 0:
        return a.lr
    progress = min(1.0, (step - a.warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress)) * a.lr


def main():
    ap = add_common_args(argparse.ArgumentParser())
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    a = parse_args(ap)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    T = a.seq_len
    gbs = a.micro_batch * world
    batches = Batches(load_bytes(a.data), T, a.micro_batch, gbs, a.seed)
    model = Gpt(a.vocab, a.layers, a.d_model, a.heads, T, a.seed)
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb, gradient_as_bucket_view=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    t_first = first_logged = cpu_first = None
    mean = torch.zeros(())
    for step in range(a.steps):
        x, y = batches.slot(step, rank)  # DP rank r takes slot r of the step
        loss = ddp(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        opt.step()
        opt.zero_grad(set_to_none=False)
        done = step + 1
        if done % a.log_every == 0 or done == a.steps:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean /= world
            now = time.perf_counter()
            if t_first is None:
                t_first, first_logged = now, done  # timing starts after the first interval
                cpu_first = time.process_time()  # this process's CPU, all its threads (Gloo's too)
            elif rank == 0:
                print(f"peer step {done}/{a.steps} loss {mean.item():.4f} grad_norm {norm.item():.3f}",
                      flush=True)
    t_end = time.perf_counter()
    cpu_ms = 1e3 * (time.process_time() - cpu_first) / (a.steps - first_logged)
    summary("ddp", a, gbs * T, a.steps - first_logged, t_end - t_first, mean.item(),
            f"gbs={gbs} bucket_mb={a.bucket_mb:g} rank0_cpu_ms_per_step={cpu_ms:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
