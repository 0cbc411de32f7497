"""Runtime: the Executor that runs compiled graphs, and the ORT-shaped InferenceSession."""
from .executor import Executor
from .session import InferenceSession, NodeArg

__all__ = ["Executor", "InferenceSession", "NodeArg"]
