"""Hand-averaged data parallelism that ends with sys.exit(0) from a main() function."""

import sys

import torch
import torch.distributed as dist
from _common import batches, model


def main() -> int:
    dist.init_process_group("gloo")
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    for x, y in batches():
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        for p in net.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
