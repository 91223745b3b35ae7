"""Run at start-up by every Python rank nezharun launches (nezharun puts this folder first on the
ranks' PYTHONPATH), so that ``torch.distributed.init_process_group("nezha")`` works in a script
that never imports nezha.

It imports nothing heavy: an import hook waits for ``torch.distributed`` to be imported, then
registers the backend name with a creator that imports ``nezha.torch`` only when a process group
is made, and lets ``env://`` reach the store nezharun serves (nezha/runner/torch_store.py). Jobs that never use torch pay one dictionary lookup per import. The ``sitecustomize``
this module shadows, if any, still runs.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _create(*args, **kwargs):
    from nezha.torch.backend.process_group import create_process_group
    return create_process_group(*args, **kwargs)


def _register(distributed):
    if not distributed.is_available():
        return
    from nezha.runner.torch_store import client_mode_for_nezharun_store
    client_mode_for_nezharun_store()
    if "NEZHA" not in distributed.Backend._plugins:
        distributed.Backend.register_backend("nezha", _create, devices=["cpu", "cuda"])


class _AfterTorchDistributed(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``torch.distributed`` to register afterwards."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorchDistributed)]
        _register(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self._loader, name)


def _run_shadowed_sitecustomize():
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if "torch.distributed" in sys.modules:
    _register(sys.modules["torch.distributed"])
else:
    sys.meta_path.insert(0, _AfterTorchDistributed())
_run_shadowed_sitecustomize()
