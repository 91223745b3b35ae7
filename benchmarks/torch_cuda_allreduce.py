"""Allreduce of CUDA tensors from PyTorch: `nezha.torch.allreduce_` against torch.distributed's Gloo on
the same tensors, in one job (ranks on one host share its GPUs round-robin: all on GPU 0 where there
is one). The time a training step would see: from the call to the result on the tensor's device
(torch.cuda.synchronize() on both sides), the slowest rank's median.

    nezharun -np 4 python benchmarks/torch_cuda_allreduce.py --sizes 8,1M,64M --iters 20 [--json F]

`--device cpu` runs the same on CPU tensors (to try the script where there is no GPU).
"""
import argparse
import datetime
import json
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

import nezha.torch as hvd
from nezha.bench.gloo_baseline import decode_endpoint, encode_endpoint, pick_free_port
from nezha.bench.sizes import parse_size


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, iters, device, warmup=3):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def slowest(seconds):
    return float(hvd.allreduce(torch.tensor([seconds], dtype=torch.float64), op=hvd.Max)[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,1M,64M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.device == "cpu":
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise SystemExit("torch_cuda_allreduce.py: torch sees no CUDA device (--device cpu to try it)")
    else:
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)

    port = pick_free_port("127.0.0.1") if rank == 0 else 0
    endpoint = hvd.broadcast(torch.from_numpy(encode_endpoint("127.0.0.1", port)), 0)
    addr, port = decode_endpoint(endpoint.numpy())
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    records = []
    for text in args.sizes.split(","):
        nbytes = max(4, parse_size(text) // 4 * 4)
        x = torch.full((nbytes // 4,), float(rank + 1), device=device)
        want = size * (size + 1) / 2
        for impl, step in (("nezha", lambda: hvd.allreduce_(x, op=hvd.Sum)),
                           ("gloo", lambda: dist.all_reduce(x))):
            x.fill_(float(rank + 1))
            step()
            sync(device)
            if not torch.all(x == want):
                raise SystemExit(f"rank {rank}: {impl} allreduce of {nbytes} B is wrong")
            t = slowest(timed(step, args.iters, device))
            busbw = nbytes * 8 * 2 * (size - 1) / size / t / 1e9
            records.append({"op": "allreduce", "bytes": nbytes, "dtype": "float32", "ranks": size,
                            "impl": f"{impl}-torch-{device.type}", "time_us": t * 1e6, "busbw_gbps": busbw})
            if rank == 0:
                print(f"{nbytes:>10} B {impl:>6}: {t * 1e6:10.1f} us  busbw {busbw:7.2f} Gbit/s", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
