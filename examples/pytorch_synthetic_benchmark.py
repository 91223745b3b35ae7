"""Synthetic training throughput with nezha.torch (the flags of Horovod's script of this name).

    nezharun -np 4 python examples/pytorch_synthetic_benchmark.py --model mlp46m --batch-size 16

Models are defined here so the script needs no torchvision: `mlp46m` (46M parameters: communication
heavy), `convnet` (a small ResNet-style CNN: compute heavy) and `mlp` (tiny, for smoke tests).
Reports images/sec per rank and in total, plus the share of each step spent waiting for gradients
(step() after backward), which is communication not hidden behind backward.
"""

import argparse
import os
import time
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import nezha.torch as hvd


class MLP(nn.Module):
    def __init__(self, width, depth, in_features, classes=1000):
        super().__init__()
        dims = [in_features] + [width] * depth
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ConvNet(nn.Module):
    def __init__(self, channels=64, blocks=4, classes=1000):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.blocks = nn.Sequential(*[Block(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.blocks(F.relu(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


MODELS = {
    # (constructor, input shape of one sample)
    "mlp46m": (lambda: MLP(width=4096, depth=2, in_features=3 * 32 * 32 * 2), (6, 32, 32)),
    "convnet": (lambda: ConvNet(), (3, 64, 64)),
    "mlp": (lambda: MLP(width=256, depth=2, in_features=3 * 8 * 8, classes=10), (3, 8, 8)),
}


def parse_args():
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="convnet", choices=sorted(MODELS),
                        help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False,
                        help="disables CUDA training")
    parser.add_argument("--use-adasum", action="store_true", default=False,
                        help="use adasum algorithm to do reduction (not implemented by Nezha)")
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads per rank (0: this host's cores / its ranks)")
    parser.add_argument("--json", type=str, default=None,
                        help="rank 0 writes the results to this JSON file")
    return parser.parse_args()


def main():
    args = parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
    elif args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    else:
        # Ranks on one host share its cores; oversubscribed OpenMP threads spin against each other
        # and against the engine's threads.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    build, sample_shape = MODELS[args.model]
    torch.manual_seed(0)
    model = build()
    device = torch.device("cuda" if args.cuda else "cpu")
    model.to(device)
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Each rank its own batch, so the averaged gradient differs from every local one and the
    # losses check the averaging (any implementation of it gives the same losses).
    torch.manual_seed(1 + hvd.rank())
    data = torch.randn(args.batch_size, *sample_shape, device=device)
    classes = model.head.out_features
    target = torch.randint(0, classes, (args.batch_size,), device=device)
    wait_s = [0.0]
    losses = []  # rank 0's loss at every step; kept as tensors so a GPU does not sync per step

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        losses.append(loss.detach())
        loss.backward()
        start = time.perf_counter()
        optimizer.step()  # waits for the gradients still in flight, then updates
        wait_s[0] += time.perf_counter() - start

    def log(message):
        if hvd.rank() == 0:
            print(message, flush=True)

    params = sum(p.numel() for p in model.parameters())
    log("Model: %s (%.1fM parameters)" % (args.model, params / 1e6))
    log("Batch size: %d" % args.batch_size)
    log("Number of %ss: %d" % ("GPU" if args.cuda else "CPU", hvd.size()))

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs, step_total_s = [], 0.0
    wait_s[0] = 0.0
    for x in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        step_total_s += elapsed
        img_sec = args.batch_size * args.num_batches_per_iter / elapsed
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, "GPU" if args.cuda else "CPU"))
        img_secs.append(img_sec)

    img_sec_mean, img_sec_conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    wait_share = wait_s[0] / step_total_s
    log("Img/sec per %s: %.1f +-%.1f" % ("GPU" if args.cuda else "CPU", img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f" % (hvd.size(), "GPU" if args.cuda else "CPU",
                                                    hvd.size() * img_sec_mean,
                                                    hvd.size() * img_sec_conf))
    log("Share of step time waiting for gradients (not overlapped with backward): %.0f%%"
        % (100 * wait_share))
    if args.json and hvd.rank() == 0:
        import json
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "params": params, "batch_size": args.batch_size,
                       "ranks": hvd.size(), "img_sec_per_rank": img_sec_mean,
                       "img_sec_total": hvd.size() * img_sec_mean,
                       "img_sec_conf_total": hvd.size() * img_sec_conf,
                       "comm_wait_share": wait_share, "step_s": step_total_s / (
                           args.num_iters * args.num_batches_per_iter),
                       "losses": [float(v) for v in losses]}, f, indent=2)
    hvd.shutdown()


if __name__ == "__main__":
    main()
