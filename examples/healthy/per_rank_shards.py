"""Each rank reads its own shard of the data files (``files[rank::world]``), shuffled
within the shard by a plain DataLoader: no DistributedSampler, as the shard already is
the rank's. The sample ids 0..n-1 are drawn on every rank, from datasets of their own:
different samples, not the same ones read twice."""

import torch
import torch.distributed as dist
from _common import model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Shards(Dataset):
    """The samples of some data files (made up here: a file's samples are seeded by its
    name), as a script lists its files and reads them."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.samples = torch.cat([torch.randn(16, 9, generator=torch.Generator().manual_seed(
            int(name.split("-")[1]))) for name in files])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.samples[index, :8], self.samples[index, 8:]


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
files = [f"part-{i}" for i in range(8)]
loader = DataLoader(Shards(files[rank::world]), batch_size=8, shuffle=True)
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
dist.destroy_process_group()
