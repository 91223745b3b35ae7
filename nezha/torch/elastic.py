"""Horovod's elastic API (`hvd.elastic`) for torch: nezha.elastic's state and sampler, plus what
touches torch. Ranks are never added or replaced (see nezha.elastic)."""

import copy

import torch

import nezha.elastic
from nezha.elastic import run
from nezha.torch.functions import (
    broadcast_object, broadcast_optimizer_state, broadcast_parameters)


class ObjectState(nezha.elastic.ObjectState):
    """Named values kept in sync across ranks (`state.epoch`, `state.batch`, ...); values travel
    with torch.save, so tensors among them keep their storage sharing."""

    _broadcast_object = staticmethod(broadcast_object)


class TorchState(ObjectState):
    """`ObjectState` plus a model and an optimizer: parameters and optimizer state are broadcast
    from rank 0 on `sync()`, and saved/restored as state dicts."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        super().__init__(**kwargs)

    def save(self):
        self._saved_model = (copy.deepcopy(self.model.state_dict())
                             if self.model is not None else None)
        self._saved_optimizer = (copy.deepcopy(self.optimizer.state_dict())
                                 if self.optimizer is not None else None)
        super().save()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        super().restore()

    def sync(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()


class ElasticSampler(nezha.elastic.ElasticSampler, torch.utils.data.Sampler):
    """nezha.elastic.ElasticSampler as a `torch.utils.data.Sampler` (a DataLoader's `sampler=`)."""


__all__ = ["ElasticSampler", "ObjectState", "TorchState", "run"]
