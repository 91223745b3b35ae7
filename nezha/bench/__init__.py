"""nezha-bench: collective benchmarks in the nccl-tests style, optionally beside a Gloo baseline.

Run one process per rank under nezharun::

    nezharun -np 4 nezha-bench --op allreduce --sizes 8,1K,64K,1M,64M --iters auto

The modules below the CLI are small and mostly pure (size parsing, bandwidth formulas, reference
inputs and outputs, table/JSON formatting) so they are tested without the engine.
"""
