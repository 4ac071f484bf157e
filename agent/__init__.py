"""xhagent: the node agent of the XingHua scheduler."""

__version__ = "0.1.0"
