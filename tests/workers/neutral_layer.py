"""The framework-neutral layer every adapter shares, on numpy only: object collectives, process
sets, Horovod's names, elastic state and sampler, and the gradient bookkeeping driving real
allreduces. Prints `OK rank R: <check>` per check; exits non-zero (AssertionError) on the first
failure."""
import numpy as np

import nezha
from nezha import elastic, horovod_api, process_sets
from nezha.compression import Compression, compress_all, decompress_all
from nezha.gradients import GradientReducer, name_parameters

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()


def ok(check):
    print(f"OK rank {RANK}: {check}", flush=True)


def objects():
    blob = {"rank": RANK, "data": np.arange(RANK * 1000), "text": "x" * RANK}
    got = nezha.broadcast_object(blob, root_rank=SIZE - 1)
    assert got["rank"] == SIZE - 1 and np.array_equal(got["data"], np.arange((SIZE - 1) * 1000))
    gathered = nezha.allgather_object(("r", RANK, "y" * RANK), name="tuples")
    assert gathered == [("r", r, "y" * r) for r in range(SIZE)], gathered
    # An adapter's own serialisation (here: repr/eval of a set) is used on every rank.
    got = nezha.broadcast_object({RANK, -RANK}, root_rank=0, name="custom",
                                 dumps=lambda o: repr(sorted(o)).encode(),
                                 loads=lambda b: set(eval(b.decode())))
    assert got == {0}, got
    ok("object collectives")


def process_sets_and_horovod_names():
    # Horovod: the set of every rank exists already (the global one); a set of rank 0 alone works,
    # and only for rank 0; an unregistered set is refused, naming it.
    try:
        process_sets.add_process_set(list(range(SIZE)))
        raise AssertionError("a duplicate of the global process set was accepted")
    except ValueError as error:
        assert "exists already" in str(error), error
    alone = process_sets.add_process_set([0])
    assert alone.size() == 1 and alone.rank() == (0 if RANK == 0 else -1) and alone.included() == (RANK == 0)
    if RANK == 0:
        assert nezha.allgather_object(RANK, process_set=alone) == [0]
        horovod_api.barrier(alone)
    assert nezha.allgather_object(RANK, process_set=process_sets.global_process_set) == list(range(SIZE))
    horovod_api.barrier(process_sets.global_process_set)
    try:
        nezha.broadcast_object(1, process_set=process_sets.ProcessSet([0]))
        raise AssertionError("an unregistered process set was accepted")
    except ValueError as error:
        assert "[0]" in str(error) and "not registered" in str(error), error
    assert process_sets.remove_process_set(alone)
    assert not process_sets.remove_process_set(process_sets.global_process_set)
    assert horovod_api.resolve_op(None, False) == nezha.Sum
    assert horovod_api.resolve_op(None, None) == nezha.Average
    for bad in (lambda: horovod_api.resolve_op(horovod_api.Adasum, None),
                lambda: horovod_api.start_timeline("t.json")):
        try:
            bad()
            raise AssertionError("no NotImplementedError")
        except NotImplementedError:
            pass
    assert horovod_api.is_homogeneous()
    assert not horovod_api.mpi_built() and horovod_api.nccl_built() == 0
    assert issubclass(horovod_api.HorovodInternalError, RuntimeError)
    ok("process sets and Horovod's names")


def elastic_state():
    state = elastic.ObjectState(epoch=RANK, weights=np.full(3, float(RANK)))
    state.sync()  # rank 0's values everywhere
    assert state.epoch == 0 and np.array_equal(state.weights, np.zeros(3))
    state.epoch = 5
    state.commit()
    state.epoch = 6

    @elastic.run
    def train(state):
        nezha.allreduce(np.ones(2 + RANK), name="elastic.mismatch")  # fails on every rank

    try:
        train(state)
        raise AssertionError("the mismatched allreduce did not raise")
    except nezha.NezhaError:
        pass
    assert state.epoch == 5, state.epoch  # the last commit, restored (after sync had run)
    sampler = elastic.ElasticSampler(range(10), shuffle=False)
    per_rank = -(-10 // SIZE)
    padded = (list(range(10)) * 2)[:per_rank * SIZE]  # every rank gets as many samples
    assert len(sampler) == per_rank and list(sampler) == padded[RANK::SIZE], list(sampler)
    sampler.record_batch(0, 2)  # each rank processed its first two samples
    holder = elastic.ObjectState(sampler=sampler)
    holder.sync()  # merges every rank's marks and re-shards the rest
    done = {i for r in range(SIZE) for i in padded[r::SIZE][:2]}
    assert sampler.processed_indices == done, sampler.processed_indices
    left = set().union(*map(set, nezha.allgather_object(list(sampler))))
    assert left == set(range(10)) - done, left
    ok("elastic state and sampler")


def gradient_bookkeeping():
    """A toy numpy optimizer: parameters are names, gradients numpy arrays; rank r uses
    parameter "unused" only when r == 0 and marks gradients ready in its own order."""
    grads = {"w1": np.full(4, 1.0 + RANK, np.float32), "w2": np.full(3, 2.0 * RANK, np.float32),
             "b": np.full(2, float(RANK), np.float64), "unused": None}
    if RANK == 0:
        grads["unused"] = np.full(2, 3.0, np.float32)

    def submit(bucket, name, op, prescale, postscale):
        for p in bucket:
            if grads[p] is None:
                grads[p] = np.zeros(2, np.float32)
        sent, ctxs = compress_all(Compression.fp16, [grads[p] for p in bucket])
        handle = nezha.grouped_allreduce_async(sent, op=op, name=name, prescale_factor=prescale,
                                               postscale_factor=postscale)
        return handle.then(lambda results: decompress_all(Compression.fp16, results, ctxs))

    def finish(bucket, results):
        for p, result in zip(bucket, results):
            grads[p][...] = result

    params = ["w1", "w2", "b", "unused"]
    reducer = GradientReducer(name_parameters([params], None), params, [["w1", "w2"]], 2,
                              nezha.Average, 2.0, submit, finish)
    order = params[:3] if RANK % 2 else params[2::-1]
    for _ in range(2):  # backward_passes_per_step=2: submitted after the second pass
        for p in order:
            reducer.ready(p)
    reducer.synchronize()
    ranks = np.arange(SIZE)
    assert np.array_equal(grads["w1"], np.full(4, np.mean(1.0 + ranks), np.float32))
    assert np.array_equal(grads["w2"], np.full(3, np.mean(2.0 * ranks), np.float32))
    assert grads["b"].dtype == np.float64 and np.allclose(grads["b"], np.mean(ranks))
    assert np.array_equal(grads["unused"], np.full(2, 3.0 / SIZE, np.float32))
    assert not reducer.in_flight
    ok("gradient bookkeeping")


objects()
process_sets_and_horovod_names()
elastic_state()
gradient_bookkeeping()
nezha.shutdown()
