"""`import nezha.tensorflow.keras as hvd`: nezha.keras under Horovod's import path."""
from nezha.keras import *  # noqa: F401,F403
from nezha.keras import callbacks  # noqa: F401
from nezha.keras import __all__  # noqa: F401
