"""Trains a small CNN on locally generated "digits" with nezha.torch; loss falls, accuracy is reported.

    nezharun -np 2 python examples/pytorch_mnist_like.py --epochs 3

The data set is built here, so nothing is downloaded: ten 8x8 glyph templates (one per class),
each sample a randomly shifted, noisy copy of its class's glyph. Every rank generates the same data
set from one seed and trains on its own shard (rank::size), as a DistributedSampler would.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import nezha.torch as hvd

# 5x3 glyphs of the digits 0-9, drawn on an 8x8 canvas.
GLYPHS = ["111101101101111", "010110010010111", "111001111100111", "111001111001111",
          "101101111001001", "111100111001111", "111100111101111", "111001010010010",
          "111101111101111", "111101111001111"]


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    templates = torch.zeros(10, 8, 8)
    for digit, bits in enumerate(GLYPHS):
        glyph = torch.tensor([float(b) for b in bits]).reshape(5, 3)
        templates[digit, 1:6, 2:5] = glyph
    labels = torch.randint(0, 10, (n,), generator=g)
    shifts = torch.randint(-1, 2, (n, 2), generator=g)
    images = torch.stack([torch.roll(templates[y], tuple(s.tolist()), dims=(0, 1))
                          for y, s in zip(labels, shifts)])
    images = images + 0.35 * torch.randn(images.shape, generator=g)
    return images.unsqueeze(1), labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.bn = hvd.SyncBatchNorm(16)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def main():
    parser = argparse.ArgumentParser(description="nezha.torch training on generated digits")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by size()")
    parser.add_argument("--train-samples", type=int, default=4096)
    parser.add_argument("--test-samples", type=int, default=1024)
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    # One intra-op thread per rank: several ranks share the host's cores (as Horovod's examples do).
    torch.set_num_threads(1)
    torch.manual_seed(1234 + hvd.rank())  # deliberately different: broadcast makes them equal
    train_x, train_y = make_dataset(args.train_samples, seed=1)
    test_x, test_y = make_dataset(args.test_samples, seed=2)
    train_x, train_y = train_x[hvd.rank()::hvd.size()], train_y[hvd.rank()::hvd.size()]
    test_x, test_y = test_x[hvd.rank()::hvd.size()], test_y[hvd.rank()::hvd.size()]

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    def evaluate():
        model.eval()
        with torch.no_grad():
            logits = model(test_x)
            loss = F.cross_entropy(logits, test_y).item()
            accuracy = (logits.argmax(1) == test_y).float().mean().item()
        model.train()
        return metric_average(loss, "test_loss"), metric_average(accuracy, "test_accuracy")

    loss0, acc0 = evaluate()
    if hvd.rank() == 0:
        print("before training: test loss %.4f, accuracy %.1f%%" % (loss0, 100 * acc0), flush=True)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(epoch))
        epoch_loss = 0.0
        steps = len(order) // args.batch_size
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
        train_loss = metric_average(epoch_loss / steps, "train_loss")
        test_loss, test_acc = evaluate()
        if hvd.rank() == 0:
            print("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.1f%%"
                  % (epoch, train_loss, test_loss, 100 * test_acc), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
