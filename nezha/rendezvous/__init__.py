"""Rendezvous: the authenticated key-value store ranks use to find each other.

``nezharun`` serves it; under torchrun, MPI or Slurm rank 0 serves it (see ``nezha.environ``).
"""

from nezha.rendezvous.client import StoreClient
from nezha.rendezvous.server import StoreServer

__all__ = ["StoreClient", "StoreServer"]
