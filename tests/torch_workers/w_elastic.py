"""hvd.elastic on a fixed set of ranks: sync from rank 0, commit/restore, the sampler's shards and
resuming mid-epoch, and a failed collective restoring the last commit."""

import torch
import torch.nn as nn

import nezha.torch as hvd
from common import assert_close, assert_identical_on_all_ranks, fail, report

DATASET = list(range(23))  # odd: shards need padding


def model_of(seed):
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def check_sync_and_commit(rank, size):
    model = model_of(seed=rank)  # every rank starts different
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, epoch=10 + rank, batch=0)

    @hvd.elastic.run
    def train(state):
        assert_identical_on_all_ranks(list(model.parameters()), "elastic.synced")
        if state.epoch != 10:
            fail("epoch after sync is %s, expected rank 0's 10" % state.epoch)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        state.epoch, state.batch = 11, 5
        state.commit()
        committed = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        state.epoch = 99
        state.restore()
        for p, c in zip(model.parameters(), committed):
            assert_close(p, c, "parameters after restore", rtol=0, atol=0)
        if (state.epoch, state.batch) != (11, 5):
            fail("values after restore: %s, %s" % (state.epoch, state.batch))
        if not opt.state_dict()["state"]:
            fail("optimizer state lost by restore")
        return "done"

    if train(state) != "done":
        fail("elastic.run did not return the function's result")
    report("sync, commit and restore")


def check_failed_collective_restores(rank, size):
    model = model_of(seed=0)
    state = hvd.elastic.TorchState(model, None, step=0)

    @hvd.elastic.run
    def train(state):
        state.step = 1
        state.commit()
        state.step = 2
        with torch.no_grad():
            model.weight.fill_(7.0)
        hvd.allreduce(torch.ones(2 + rank), name="elastic.mismatch")  # fails on every rank

    try:
        train(state)
        fail("a mismatched allreduce inside elastic.run did not raise")
    except hvd.HorovodInternalError:
        pass
    if state.step != 1 or torch.equal(model.weight, torch.full_like(model.weight, 7.0)):
        fail("the state was not restored to its last commit after the failure")
    report("failure restores the last commit")


def check_sampler(rank, size):
    sampler = hvd.elastic.ElasticSampler(DATASET, shuffle=True, seed=3)
    sampler.set_epoch(1)
    shards = hvd.allgather_object(list(sampler))
    if any(len(s) != len(shards[0]) for s in shards) or len(shards[0]) != len(sampler):
        fail("shards of unequal length: %s" % shards)
    if set().union(*map(set, shards)) != set(DATASET):
        fail("the shards do not cover the dataset: %s" % shards)
    # Each rank processes its first two batches of 3, then the ranks resume the epoch together.
    mine = list(sampler)
    sampler.record_batch(0, 3)
    sampler.record_batch(1, 3)
    state = hvd.elastic.TorchState(sampler=sampler)
    state.sync()
    done = set().union(*map(set, hvd.allgather_object(mine[:6])))
    rest = hvd.allgather_object(list(state.sampler))
    left = set().union(*map(set, rest))
    if left != set(DATASET) - done:
        fail("after resuming: %s left, expected %s" % (sorted(left), sorted(set(DATASET) - done)))
    sampler.set_epoch(2)
    if len(sampler) != -(-len(DATASET) // size):
        fail("set_epoch did not start afresh: %d samples" % len(sampler))
    report("ElasticSampler shards and resumes")


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_sync_and_commit(rank, size)
    check_failed_collective_restores(rank, size)
    check_sampler(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
