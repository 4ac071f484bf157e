"""The pure scheduling core's front half: XSL policies, the unified TaskSpec, placement
with typed Pending reasons, and the pending queue that re-evaluates on policy changes."""

from .documents import DocumentError, Inputs, load_all, load_items
from .explanation import Explanation, explain
from .placement import Candidate, Demand, PlacementDecision, Reason, decide, decide_demand, evaluate
from .policy import Match, SchedulingPolicy, choose, dump_policy, parse_policy, tie_warnings
from .queue import Pending, PendingQueue
from .state import Allocation, Cluster, GpuShare, NodeResources
from .task import Deadline, Task, dump_task, parse_task

__all__ = [
    "Allocation",
    "Candidate",
    "Cluster",
    "Deadline",
    "Demand",
    "Explanation",
    "GpuShare",
    "DocumentError",
    "Inputs",
    "Match",
    "NodeResources",
    "Pending",
    "PendingQueue",
    "PlacementDecision",
    "Reason",
    "SchedulingPolicy",
    "Task",
    "choose",
    "decide",
    "decide_demand",
    "dump_policy",
    "dump_task",
    "evaluate",
    "explain",
    "load_all",
    "load_items",
    "parse_policy",
    "parse_task",
    "tie_warnings",
]
