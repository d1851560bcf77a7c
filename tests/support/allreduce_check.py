# allreduce_check.py: an unmodified-style PyTorch program for the launcher's
# integration test. It uses only torchrun's environment (env://, gloo),
# all-reduces (rank + 1) and checks the sum is world * (world + 1) / 2.
# Not a benchmark: it exits 0 when the sum is right and 1 otherwise.
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    ok = abs(t.item() - expected) < 1e-6
    print(f"allreduce rank {rank}/{world} local {os.environ['LOCAL_RANK']}: "
          f"sum {t.item():g} expected {expected:g} {'OK' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
