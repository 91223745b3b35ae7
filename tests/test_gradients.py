"""nezha.gradients, the gradient-reduction bookkeeping of every adapter's distributed optimizer,
with fake submit/finish callables (one process; only rank 0's order of names needs a job of one)."""
import os

import pytest

import nezha
from nezha.gradients import GradientReducer, form_buckets, name_parameters, scale_factors
from nezha.handle import Handle


class Param:
    """A parameter as the bookkeeping sees one: a hashable key (with a shape for messages)."""

    def __init__(self, label, shape=(2,)):
        self.label, self.shape = label, shape

    def __repr__(self):
        return self.label


class Adapter:
    """Records what the bookkeeping asks of an adapter."""

    def __init__(self):
        self.submitted, self.finished = [], []

    def submit(self, bucket, name, op, prescale, postscale):
        self.submitted.append((bucket, name, op, prescale, postscale))
        return Handle([], lambda: ["reduced %s" % p for p in bucket], [name])

    def finish(self, bucket, results):
        self.finished.append((bucket, results))


def reducer(params, adapter, groups=None, passes=1, op=nezha.Average, predivide=1.0, **kw):
    names = {p: "model.%s" % p.label for p in params}
    return GradientReducer(names, params, groups, passes, op, predivide, adapter.submit,
                           adapter.finish, **kw)


@pytest.fixture
def job_of_one(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("NEZHA_", "RANK", "WORLD_SIZE", "OMPI_", "PMI_", "SLURM_")):
            monkeypatch.delenv(k)
    nezha.init()
    yield
    nezha.shutdown()


def test_names_are_generated_from_positions_or_taken_from_named_parameters():
    a, b, c = Param("a"), Param("b"), Param("c")
    assert name_parameters([[a, b], [c]], None) == {
        a: "allreduce.noname.0.0", b: "allreduce.noname.0.1", c: "allreduce.noname.1.0"}
    assert name_parameters([[a, b]], iter([("x", a), ("y", b)])) == {a: "x", b: "y"}
    with pytest.raises(ValueError, match="tuples"):
        name_parameters([[a]], [a])
    with pytest.raises(ValueError, match="duplicates: x"):
        name_parameters([[a, b]], [("x", a), ("x", b)])
    with pytest.raises(ValueError, match=r"1 optimizer parameter\(s\) are not in it .*\(3, 4\)"):
        name_parameters([[a, Param("d", (3, 4))]], [("x", a)])


def test_buckets_without_groups_and_with_lists_of_parameters():
    a, b, c, d = (Param(x) for x in "abcd")
    names = {p: p.label for p in (a, b, c, d)}
    assert form_buckets([a, b], None, names) == {a: (a,), b: (b,)}
    bucket_of = form_buckets([a, b, c, d], [[c, a], [Param("frozen")]], names)
    assert bucket_of == {a: (a, c), c: (a, c), b: (b,), d: (d,)}
    with pytest.raises(ValueError, match="two groups"):
        form_buckets([a, b], [[a], [a, b]], names)
    with pytest.raises(ValueError, match="non-negative"):
        form_buckets([a], -1, names)


def test_int_groups_split_rank_0s_order_of_names(job_of_one):
    params = [Param(x) for x in "abcde"]
    bucket_of = form_buckets(params, 2, {p: p.label for p in params})
    assert sorted(set(bucket_of.values()), key=len) == [tuple(params[3:]), tuple(params[:3])]


def test_a_bucket_is_submitted_once_all_its_gradients_are_final():
    a, b, c = Param("a"), Param("b"), Param("c")
    adapter = Adapter()
    r = reducer([c, b, a], adapter, groups=[[a, b]], passes=2)
    assert r.trainable == [a, b, c] and not r.in_flight
    for p in (a, b, a):
        r.ready(p)
    assert adapter.submitted == [] and r.in_flight
    r.ready(b)
    assert adapter.submitted == [((a, b), "model.a", nezha.Average, 1.0, 1.0)]
    with pytest.raises(AssertionError, match="'model.a' was computed more than "
                                             "backward_passes_per_step=2 times"):
        r.ready(a)


def test_synchronize_submits_unused_parameters_finishes_every_bucket_and_starts_again():
    a, b, frozen = Param("a"), Param("b"), Param("frozen")
    adapter = Adapter()
    r = reducer([a, b, frozen], adapter, still_trainable=lambda p: p is not frozen)
    r.ready(a)
    r.synchronize()  # b was not used on this rank: submitted now, so no rank waits for it
    assert [s[0] for s in adapter.submitted] == [(a,), (b,)]
    assert adapter.finished == [((a,), ["reduced a"]), ((b,), ["reduced b"])]
    assert not r.in_flight
    r.ready(a)  # a new step: a's pass count started again
    assert [s[0] for s in adapter.submitted][-1] == (a,)


def test_average_is_split_around_the_sum_by_the_predivide_factor():
    assert scale_factors(nezha.Average, 4.0) == (0.25, 4.0)
    assert scale_factors(nezha.Sum, 1.0) == (1.0, 1.0)
    adapter = Adapter()
    a = Param("a")
    reducer([a], adapter, predivide=8.0).ready(a)
    assert adapter.submitted[0][3:] == (0.125, 8.0)
    with pytest.raises(ValueError, match="op == Average"):
        reducer([a], adapter, op=nezha.Sum, predivide=2.0)
    with pytest.raises(ValueError, match=">= 1"):
        reducer([a], adapter, passes=0)


def test_reset_and_a_new_number_of_passes_restart_the_counts():
    a, b = Param("a"), Param("b")
    adapter = Adapter()
    r = reducer([a, b], adapter, groups=[[a, b]])
    r.ready(a)
    r.reset()
    assert not r.in_flight
    r.set_backward_passes_per_step(2)
    r.ready(a), r.ready(b), r.ready(a)
    assert adapter.submitted == []
    r.ready(b)
    assert len(adapter.submitted) == 1
