"""The torch.distributed backend "nezha": ``import nezha.torch`` registers it, then
``dist.init_process_group("nezha")`` (or ``"cpu:nezha,cuda:nezha"``) runs DDP, FSDP2, DeviceMesh
and every ``torch.distributed`` collective on nezha's engine, over every rail.
"""
from nezha.torch.backend.process_group import BACKEND_NAME, ProcessGroupNezha, register
from nezha.torch.backend.work import NezhaBackendError, NezhaWork

__all__ = ["BACKEND_NAME", "NezhaBackendError", "NezhaWork", "ProcessGroupNezha", "register"]
