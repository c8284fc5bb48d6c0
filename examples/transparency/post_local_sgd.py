"""Post-local SGD: DDP all-reduces gradients over the world for the first 2 steps, then
only within each subgroup of 2 ranks, and PeriodicModelAverager averages the parameters
over the world every 4th step. Between averagings the two subgroups' models are apart on
purpose; at each averaging they meet. (On CPU the state needs an explicit subgroup.)"""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
subgroup, _ = dist.new_subgroups(group_size=2)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
state = post_local.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                     start_localSGD_iter=2)
model.register_comm_hook(state, post_local.post_localSGD_hook)
averager = PeriodicModelAverager(period=4, warmup_steps=2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in data(rank, 10):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    averager.average_parameters(model.parameters())
digest("post-local-sgd", model.parameters())
dist.destroy_process_group()
