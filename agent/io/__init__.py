"""io_uring I/O for the agent: rings over `xhagent._uring` (liburing)."""
from .ring import Ring, UringError, aligned_buffer, supported_ops

__all__ = ["Ring", "UringError", "aligned_buffer", "supported_ops"]
