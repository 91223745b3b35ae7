"""Horovod's elastic API on the fixed set of ranks nezharun starts, for every framework.

Scripts written for elastic Horovod (`@hvd.elastic.run`, an `ObjectState` or a framework's state,
`ElasticSampler`) run unchanged. What they get is what Horovod gives a job launched without elastic
options: the state is synchronized from rank 0 when the training function starts, `commit()` keeps a
copy, `restore()` goes back to it, and `ElasticSampler` shards what is left of an epoch. What they
do not get is a change of workers: nezharun has no elastic mode, so `check_host_updates()` never
finds one, and a failed collective (a lost rank, a timeout) restores the last commit and is raised
instead of being retried with the ranks that remain.
"""
from __future__ import annotations

import copy
import functools
import math
import random
from typing import Any, Callable, Iterable, Iterator, List

from . import objects
from ._core import NezhaError
from .basics import rank, size


class ElasticSampler:
    """Shards a dataset's indices over the ranks, skipping what was already processed this epoch.

    `record_batch(i, batch_size)` (or `record_indices`) marks this rank's samples as done; a state
    holding the sampler merges every rank's marks on `sync()`, and the rest of the epoch is sharded
    again. Each epoch's order is a permutation seeded by `seed + epoch` (the same on every rank);
    shards are padded by repeating samples so every rank gets as many. Only `len(dataset)` is used.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.indices: List[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` afresh (nothing processed yet)."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Marks batch `batch_idx` of this rank's current shard as processed."""
        self.record_indices(self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size])

    def record_indices(self, indices: Iterable[int]) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def reset(self) -> None:
        """Re-shards what is left of the epoch over the current ranks."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        remaining = [i for i in order if i not in self.processed_indices]
        replicas = size()
        self.num_samples = math.ceil(len(remaining) / replicas) if remaining else 0
        total = self.num_samples * replicas
        padded = (remaining * math.ceil(total / len(remaining)))[:total] if remaining else []
        self.indices = padded[rank():total:replicas]

    def sync(self, name: str = "sampler") -> None:
        """Every rank learns what every rank processed, then re-shards the rest."""
        marks = objects.allgather_object(sorted(self.processed_indices), name="elastic.%s" % name)
        self.processed_indices = set().union(*map(set, marks))
        self.reset()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples


class ObjectState:
    """Named values kept in sync across ranks (`state.epoch`, `state.batch`, ...)."""

    # How sync() sends the values; an adapter whose values may hold its tensors sets its own.
    _broadcast_object: Callable[..., Any] = staticmethod(objects.broadcast_object)

    def __init__(self, **kwargs: Any) -> None:
        self._names = list(kwargs)
        self._reset_callbacks: List[Callable[[], None]] = []
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = {}
        self.save()

    def save(self) -> None:
        """Keeps a copy of every value, for `restore()`."""
        self._saved = {name: self._snapshot(getattr(self, name)) for name in self._names}

    def restore(self) -> None:
        """Puts back the values of the last `save()`/`commit()`."""
        for name, saved in self._saved.items():
            self._put_back(name, saved)

    def commit(self) -> None:
        """Saves the state (a point to come back to) and checks for new workers (never any here)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """The set of ranks never changes under nezharun: nothing to do."""

    def sync(self) -> None:
        """As Horovod's ObjectState: every rank takes rank 0's last saved values (its last
        commit, or what it was made with) as its values and as the point restore() returns to,
        so a change not committed yet is dropped; samplers merge what every rank has
        processed."""
        samplers = {name: getattr(self, name) for name in self._names
                    if isinstance(getattr(self, name), ElasticSampler)}
        others = [name for name in self._names if name not in samplers]
        values = self._broadcast_object({name: self._saved[name] for name in others},
                                        root_rank=0, name="elastic.state")
        for name, value in values.items():
            self._saved[name] = value
            self._put_back(name, value)
        for name, sampler in samplers.items():
            sampler.sync(name)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Callbacks Horovod runs after the workers change; they never change here, so never run."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    @staticmethod
    def _snapshot(value: Any) -> Any:
        if hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
            return copy.deepcopy(value.state_dict())
        return copy.deepcopy(value)

    def _put_back(self, name: str, saved: Any) -> None:
        current = getattr(self, name)
        if hasattr(current, "state_dict") and hasattr(current, "load_state_dict"):
            current.load_state_dict(copy.deepcopy(saved))
        else:
            setattr(self, name, copy.deepcopy(saved))


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's `@hvd.elastic.run`: `func(state, ...)` starts from rank 0's state. A failed
    collective restores the last commit and is raised (Horovod would retry with the ranks left;
    nezharun cannot add or drop ranks)."""

    @functools.wraps(func)
    def wrapper(state: ObjectState, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        try:
            return func(state, *args, **kwargs)
        except NezhaError:
            state.restore()
            raise

    return wrapper


__all__ = ["ElasticSampler", "ObjectState", "run"]
