#!/usr/bin/env python3
# A ZeRO peer: gpt_ddp.py's GPT, data, batch and optimizer, sharded with FSDP2
# (torch.distributed.fsdp.fully_shard) over all ranks: each Block is one FSDP
# unit, the root holds the embeddings, ln_f and head. reshard_after_forward=1
# (default) is ZeRO-3; 0 keeps parameters gathered from forward to backward
# (ZeRO-2-like). It does not do mixed precision, CPU offload or HSDP.
# CPU with gloo, one thread per rank; launch with the venv's torchrun:
#   $VENV/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 \
#       bench/peer/gpt_fsdp.py --data data/corpus.txt
# Rank 0 prints "PEER kind=fsdp2 tokens_per_s=<x> step_ms=<y> peak_rss_mb=<z>
# final_loss=<l> ..." (peer_common.summary) as its last line.
import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from gpt_ddp import Gpt, lr_at
from peer_common import Batches, add_common_args, load_bytes, parse_args, summary


def main():
    ap = add_common_args(argparse.ArgumentParser())
    ap.add_argument("--reshard-after-forward", type=int, default=1, choices=(0, 1),
                    help="1: ZeRO-3 (free gathered parameters after forward); 0: keep them to backward")
    a = parse_args(ap)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))

    T = a.seq_len
    gbs = a.micro_batch * world
    batches = Batches(load_bytes(a.data), T, a.micro_batch, gbs, a.seed)
    # Every rank draws the full seeded model (gpt_ddp.py's init), then
    # fully_shard keeps this rank's dim-0 slice of each parameter.
    model = Gpt(a.vocab, a.layers, a.d_model, a.heads, T, a.seed)
    reshard = bool(a.reshard_after_forward)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    # Parameters are now DTensors; dim() is the global one, so the groups match gpt_ddp.py.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    t_first = first_logged = cpu_first = None
    mean = torch.zeros(())
    for step in range(a.steps):
        x, y = batches.slot(step, rank)
        loss = model(x, y)  # this rank's mean; FSDP2 averages gradients over ranks
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensor, global norm
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        opt.step()
        opt.zero_grad()
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
                print(f"peer step {done}/{a.steps} loss {mean.item():.4f} "
                      f"grad_norm {norm.full_tensor().item():.3f}", flush=True)
    t_end = time.perf_counter()
    cpu_ms = 1e3 * (time.process_time() - cpu_first) / (a.steps - first_logged)
    summary("fsdp2", a, gbs * T, a.steps - first_logged, t_end - t_first, mean.item(),
            f"gbs={gbs} reshard_after_forward={int(reshard)} rank0_cpu_ms_per_step={cpu_ms:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
