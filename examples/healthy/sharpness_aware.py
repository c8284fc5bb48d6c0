"""Sharpness-aware minimisation (SAM, as the widely used davda54/sam optimiser runs it)
under DDP: each step's first backward finds the direction to perturb the weights, its
zero_grad() clears that gradient, the weights move, and a second forward and backward at
the perturbed weights gives the gradient the step applies. Two forwards and a clear
between them in every step, and no micro-batch is lost: the weights changed between.
The model's state dict is checked at the end: tracing leaves its keys as torch made them."""

import torch
import torch.distributed as dist
from _common import model
from torch.nn.parallel import DistributedDataParallel


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base = base(self.param_groups, **kwargs)

    @torch.no_grad()
    def first_step(self):
        norm = torch.norm(torch.stack([p.grad.norm() for group in self.param_groups
                                       for p in group["params"] if p.grad is not None]))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["e_w"] = e_w = p.grad * group["rho"] / (norm + 1e-12)
                    p.add_(e_w)  # to the local worst case
        self.zero_grad()

    @torch.no_grad()
    def second_step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if "e_w" in self.state[p]:
                    p.sub_(self.state[p]["e_w"])  # back to the weights, then the step
        self.base.step()
        self.zero_grad()


dist.init_process_group("gloo")
generator = torch.Generator().manual_seed(dist.get_rank())
net = model()
ddp = DistributedDataParallel(net)
optimizer = SAM(ddp.parameters(), torch.optim.SGD, lr=0.05, momentum=0.9)
for step in range(6):
    inputs, targets = torch.randn(16, 8, generator=generator), torch.randn(16, 1,
                                                                           generator=generator)
    torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
    optimizer.first_step()
    torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
    optimizer.second_step()
assert list(ddp.state_dict()) == [f"module.{name}" for name in net.state_dict()], \
    list(ddp.state_dict())
dist.destroy_process_group()
