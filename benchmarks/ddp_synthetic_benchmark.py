#!/usr/bin/env python3
"""The baseline of examples/pytorch_synthetic_benchmark.py: the same models, batch, seeds, learning
rate and step loop, with torch DistributedDataParallel over Gloo (or, with --backend nezha, over
the torch.distributed backend "nezha") instead of nezha.torch.

    nezharun -np 4 ... python benchmarks/ddp_synthetic_benchmark.py --model mlp46m --batch-size 16 \\
        --master-addr 10.50.0.1 --master-port 29510 --gloo-ifname rail0,rail1
    nezharun -np 4 --rails R0,R1 ... python benchmarks/ddp_synthetic_benchmark.py --model mlp46m \\
        --batch-size 16 --backend nezha            # DDP on every rail nezharun gives

Rank and world size come from NEZHA_RANK/NEZHA_SIZE (set by nezharun; RANK/WORLD_SIZE otherwise),
so nezharun launches it exactly like the nezha.torch example; nezha itself is not initialised.
GLOO_SOCKET_IFNAME (--gloo-ifname) picks Gloo's NICs: with a comma list Gloo round-robins its
pairs over them, so DDP's concurrent bucket allreduces spread over the rails.

`--compute-only` runs the same steps with no process group and no allreduce (every rank trains on
its own): launched on the same hosts, it is the step's compute time under the same CPU sharing.
"""

import argparse
import datetime
import json
import os
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from pytorch_synthetic_benchmark import MODELS  # noqa: E402  (one definition of the models)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="PyTorch DDP (Gloo) synthetic benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="convnet", choices=sorted(MODELS), help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads per rank (0: torch's default)")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nezha"),
                        help="torch.distributed backend; nezha: env:// as nezharun provides it")
    parser.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR"),
                        help="address of rank 0's TCPStore (default $MASTER_ADDR)")
    parser.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT", "29500")),
                        help="port of rank 0's TCPStore (default $MASTER_PORT or 29500)")
    parser.add_argument("--gloo-ifname", default=None, metavar="IF[,IF]",
                        help="sets GLOO_SOCKET_IFNAME (a comma list round-robins over the NICs)")
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="process group timeout for every collective")
    parser.add_argument("--compute-only", action="store_true",
                        help="no process group, no allreduce: every rank steps on its own")
    parser.add_argument("--json", default=None, help="rank 0 writes the results to this JSON file")
    args = parser.parse_args(argv)
    if not args.compute_only and args.backend == "gloo" and not args.master_addr:
        parser.error("--master-addr (or MASTER_ADDR) is needed unless --compute-only")
    return args


def rank_and_world():
    rank = os.environ.get("NEZHA_RANK", os.environ.get("RANK", "0"))
    world = os.environ.get("NEZHA_SIZE", os.environ.get("WORLD_SIZE", "1"))
    return int(rank), int(world)


def main(argv=None):
    args = parse_args(argv)
    rank, world = rank_and_world()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    if args.gloo_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.gloo_ifname  # read by Gloo at init
    distributed = not args.compute_only and world > 1
    if distributed and args.backend == "nezha":
        import nezha.torch  # noqa: F401  (registers the backend)
        dist.init_process_group("nezha", timeout=datetime.timedelta(seconds=args.timeout_s))
    elif distributed:
        dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.master_port}",
                                rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=args.timeout_s))

    # Seeds, learning rate and data exactly as in the nezha.torch example, so the two runs'
    # losses agree step by step when both average the gradients correctly.
    build, sample_shape = MODELS[args.model]
    torch.manual_seed(0)
    model = build()
    classes = model.head.out_features
    params = sum(p.numel() for p in model.parameters())
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * world)
    torch.manual_seed(1 + rank)
    data = torch.randn(args.batch_size, *sample_shape)
    target = torch.randint(0, classes, (args.batch_size,))
    losses = []

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        losses.append(loss.detach())
        loss.backward()  # DDP: returns once every bucket's allreduce has finished
        optimizer.step()

    def log(message):
        if rank == 0:
            print(message, flush=True)

    mode = ("compute only" if not distributed else "DDP/nezha" if args.backend == "nezha"
            else f"DDP/Gloo on {os.environ.get('GLOO_SOCKET_IFNAME', 'default NIC')}")
    log("Model: %s (%.1fM parameters), %s" % (args.model, params / 1e6, mode))
    log("Batch size: %d" % args.batch_size)
    log("Number of CPUs: %d" % world)
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs, total_s = [], 0.0
    for x in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        total_s += elapsed
        img_secs.append(args.batch_size * args.num_batches_per_iter / elapsed)
        log("Iter #%d: %.1f img/sec per CPU" % (x, img_secs[-1]))
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    log("Img/sec per CPU: %.1f +-%.1f" % (mean, conf))
    log("Total img/sec on %d CPU(s): %.1f +-%.1f" % (world, world * mean, world * conf))
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "params": params, "batch_size": args.batch_size,
                       "ranks": world, "img_sec_per_rank": mean, "img_sec_total": world * mean,
                       "img_sec_conf_total": world * conf,
                       "step_s": total_s / (args.num_iters * args.num_batches_per_iter),
                       "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
                       "backend": args.backend if distributed else None,
                       "compute_only": not distributed,
                       "losses": [float(v) for v in losses]}, f, indent=2)
    if distributed:
        # Every rank past its last allreduce, and DDP's reducer (whose hooks Gloo's worker thread
        # calls back into Python) gone, before the process group goes: otherwise a rank's Gloo
        # thread can still be reaching for the GIL while the interpreter exits (torch aborts).
        dist.barrier()
        del model, optimizer
        dist.destroy_process_group()
        exit_before_interpreter_teardown()


def exit_before_interpreter_teardown():
    """Ends the process without finalizing the interpreter. Gloo's worker thread drops its last
    reference to the barrier's work object (whose saved thread-local state holds a Python object)
    shortly after the barrier returns; if that lands while the interpreter is finalizing, taking the
    GIL ends the thread inside a noexcept destructor and torch aborts (seen about 1 run in 20 on a
    loaded 2-core machine with torch 2.13; pytorch/pytorch#190489, the atexit fix in #179291 was
    abandoned). Every result is written and every rank is past the barrier, so nothing is lost."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
