"""Lightning's Trainer.fit with DDPStrategy(process_group_backend="nezha") on 2 ranks under
nezharun (which gives each rank torchrun's variables, so Lightning joins the job rather than
launching one), against the same model trained by one process with a plain loop on the full
batches."""

import os
import warnings

import torch
import torch.nn as nn

import lightning as L
from lightning.pytorch.strategies import DDPStrategy

from dist_common import assert_identical_on_all_ranks, expect, fail, report

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
SAMPLES, PER_RANK_BATCH, WORLD, LR = 48, 4, 2, 0.05


def data():
    g = torch.Generator().manual_seed(5)
    return torch.randn(SAMPLES, 10, generator=g), torch.randn(SAMPLES, 2, generator=g)


def network():
    torch.manual_seed(77)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = network()

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def one_process():
    """DistributedSampler without shuffling gives rank r samples r, r + 2, ...: each step's two
    per-rank batches together are the next 2 x PER_RANK_BATCH samples in order."""
    net = network()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = data()
    step = PER_RANK_BATCH * WORLD
    for first in range(0, SAMPLES, step):
        opt.zero_grad()
        nn.functional.mse_loss(net(x[first:first + step]), y[first:first + step]).backward()
        opt.step()
    return [p.detach() for p in net.parameters()]


x, y = data()
dataset = torch.utils.data.TensorDataset(x, y)
# Lightning's own sampler would shuffle the training data; this one keeps the order.
sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=WORLD,
                                              rank=int(os.environ["RANK"]), shuffle=False)
loader = torch.utils.data.DataLoader(dataset, batch_size=PER_RANK_BATCH, sampler=sampler)
model = Regression()
trainer = L.Trainer(accelerator="cpu", devices=WORLD, num_nodes=1, max_epochs=1,
                    strategy=DDPStrategy(process_group_backend="nezha"), logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, use_distributed_sampler=False)
trainer.fit(model, loader)
import torch.distributed as dist  # noqa: E402

expect(dist.get_backend() == "nezha", "Lightning's process group is %s" % dist.get_backend())
expect(trainer.world_size == WORLD and trainer.global_rank == int(os.environ["RANK"]),
       "Lightning's ranks")
params = [p.detach() for p in model.net.parameters()]
for i, (p, w) in enumerate(zip(params, one_process())):
    if not torch.allclose(p, w, rtol=0, atol=1e-5):
        fail("parameter %d differs from one process by %.3g" % (i, (p - w).abs().max().item()))
assert_identical_on_all_ranks(params, "Lightning")
report("Lightning DDPStrategy(process_group_backend='nezha') matches one process")
