"""nezha.torch with process sets, as Horovod's test_torch.py uses them: the job split into the even
and the odd ranks (plus the set of ranks 0 and 1 where there are more than 2), every collective
and its gradient within a set against torch references computed here, a DistributedOptimizer whose
set trains on its own, equal to one process training on that set's batches, and the errors."""

import itertools

import torch

import nezha.torch as hvd
from common import assert_close, assert_identical_on_all_ranks, fail, report

hvd.init()
rank, size = hvd.rank(), hvd.size()
even_ranks = [r for r in range(size) if r % 2 == 0]
odd_ranks = [r for r in range(size) if r % 2 == 1]
even_set = hvd.add_process_set(even_ranks)
odd_set = hvd.add_process_set(odd_ranks)
this_set, set_ranks = (even_set, even_ranks) if rank % 2 == 0 else (odd_set, odd_ranks)
set_size = len(set_ranks)


def seeded(r, shape, dtype, tag):
    g = torch.Generator().manual_seed(1000 * tag + r)
    return (torch.randint(-100, 100, shape, generator=g)).to(dtype)


# allreduce, in place and async, every dtype x dim (Horovod's test_horovod_allreduce_process_sets)
for tag, (dtype, dim) in enumerate(itertools.product(
        (torch.int32, torch.int64, torch.float32, torch.float64), (1, 2, 3))):
    shape = [17] * dim
    summed = hvd.allreduce(seeded(rank, shape, dtype, tag), op=hvd.Sum, process_set=this_set)
    want = sum(seeded(r, shape, dtype, tag) for r in set_ranks)
    assert_close(summed, want.to(dtype), "allreduce %s dim %d" % (dtype, dim))
    x = seeded(rank, shape, dtype, tag)
    hvd.allreduce_(x, op=hvd.Sum, process_set=this_set)
    assert_close(x, want.to(dtype), "allreduce_ %s dim %d" % (dtype, dim))
avg = hvd.allreduce(torch.full((5,), float(rank)), process_set=this_set)
assert_close(avg, torch.full((5,), sum(set_ranks) / set_size), "average over the set")
handles = [hvd.allreduce_async(torch.full((3,), float(rank + i)), op=hvd.Sum, process_set=this_set)
           for i in range(4)]
for i, h in enumerate(handles):
    assert_close(hvd.synchronize(h), torch.full((3,), float(sum(r + i for r in set_ranks))), "async %d" % i)
grouped = hvd.grouped_allreduce([torch.ones(2) * rank, torch.ones(3, dtype=torch.float64)], op=hvd.Sum,
                                process_set=this_set)
assert_close(grouped[0], torch.ones(2) * sum(set_ranks), "grouped_allreduce 0")
assert_close(grouped[1], torch.full((3,), float(set_size), dtype=torch.float64), "grouped_allreduce 1")
report("allreduce")

# allgather with rows per rank, broadcast from every member, alltoall, reducescatter
gathered = hvd.allgather(torch.full((rank + 1, 2), rank, dtype=torch.int32), process_set=this_set)
assert_close(gathered, torch.cat([torch.full((r + 1, 2), r, dtype=torch.int32) for r in set_ranks]), "allgather")
for root in set_ranks:
    got = hvd.broadcast(torch.full((4, 4), float(rank)), root, process_set=this_set)
    assert_close(got, torch.full((4, 4), float(root)), "broadcast from %d" % root)
rows = torch.arange(set_size * 2, dtype=torch.float32).reshape(-1, 1) + 100 * rank
out = hvd.alltoall(rows, process_set=this_set)
me = set_ranks.index(rank)
assert_close(out, torch.cat([torch.arange(set_size * 2, dtype=torch.float32).reshape(-1, 1)[me * 2:me * 2 + 2]
                             + 100 * r for r in set_ranks]), "alltoall")
scattered = hvd.reducescatter(torch.full((set_size * 3, 2), float(rank)), op=hvd.Sum, process_set=this_set)
assert_close(scattered, torch.full((3, 2), float(sum(set_ranks))), "reducescatter")
report("allgather broadcast alltoall reducescatter")

# gradients: allreduce (Average of Average), allgather (its rows of the averaged gradient)
x = torch.full((3,), float(rank), requires_grad=True)
hvd.allreduce(x, op=hvd.Average, process_set=this_set).sum().backward()
assert_close(x.grad, torch.ones(3), "allreduce grad")
x = torch.ones(rank + 1, 2, requires_grad=True)
(hvd.allgather(x, process_set=this_set) * 2).sum().backward()
assert_close(x.grad, torch.full((rank + 1, 2), 2.0), "allgather grad")
report("gradients")

data = {r: (seeded(r, (8, 4), torch.float32, 90) / 50, seeded(r, (8, 1), torch.float32, 91) / 50) for r in range(size)}


def train_against_reference(process_set, trained_on, seed, steps, what):
    """`steps` of a DistributedOptimizer of `process_set` on this rank's batch must give the weights
    of one process training plain SGD on the concatenated batches of the ranks `trained_on`."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=process_set)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data[rank][0]), data[rank][1]).backward()
        opt.step()
        ref_opt.zero_grad()
        xs = torch.cat([data[r][0] for r in trained_on])
        ys = torch.cat([data[r][1] for r in trained_on])
        torch.nn.functional.mse_loss(reference(xs), ys).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_close(p, q, what, rtol=1e-5, atol=1e-6)
    report(what)


# A DistributedOptimizer per set: each set trains on its own members' batches.
train_against_reference(this_set, set_ranks, 0, 3, "DistributedOptimizer")
# The even set's DistributedOptimizer built on every rank (Horovod's test_optimizer_process_sets):
# its members train together, a rank outside it steps on its own batch alone, and nobody waits.
train_against_reference(even_set, even_ranks if rank in even_ranks else [rank], 1, 2,
                        "DistributedOptimizer outside its set")

# errors: another set's collective, a mismatch within the set (raised on every member)
other = odd_set if this_set is even_set else even_set
if other.size() > 0:
    try:
        hvd.allreduce(torch.ones(2), process_set=other)
        fail("a collective of a set without this rank did not raise")
    except ValueError as error:
        if "is not in" not in str(error):
            fail("wrong error for a set without this rank: %s" % error)
if set_size > 1:
    try:
        hvd.allreduce(torch.ones(2 + rank), name="mismatch", process_set=this_set)
        fail("a shape mismatch in a set did not raise")
    except hvd.NezhaError as error:
        if "mismatched" not in str(error):
            fail("mismatch error: %s" % error)
assert_identical_on_all_ranks([hvd.allreduce(torch.ones(2), op=hvd.Sum)], "global after set errors")
report("errors")

if not (hvd.remove_process_set(odd_set) and hvd.remove_process_set(even_set)):
    fail("remove_process_set returned False")
report("removal")
