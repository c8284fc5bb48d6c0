"""Each rank picks its backend from what it sees of its own machine: nccl where a GPU is
visible, gloo where none is. On a cluster where one node's GPUs are hidden (an empty
CUDA_VISIBLE_DEVICES in its job script) or absent, its ranks ask for gloo while the others
ask for nccl, and the group never forms: gloo's ranks wait in init_process_group for
peers that never join gloo, and nccl's hang at their first collective (here, with no
GPU, nccl's rank fails to make its backend at once). Odd ranks stand in for the node
whose GPUs are visible."""

import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
sees_a_gpu = torch.cuda.is_available() or rank % 2 == 1  # (the stand-in, see above)
backend = "nccl" if sees_a_gpu else "gloo"  # BUG: each rank's own view decides
dist.init_process_group(backend)
x = torch.ones(4)
dist.all_reduce(x)
dist.destroy_process_group()
