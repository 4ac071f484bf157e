"""The agent's durable state (SQLite): tasks, events, policy versions and intents.

Its public interface is `Store`, the typed records that cross it (records.py) and the task
states (states.py); nothing here imports the scheduler loop, the API or the executor.
"""

from .records import (
    Event,
    HeldGpu,
    Intent,
    Owner,
    Placement,
    PolicyRecord,
    TaskRecord,
    TaskSummary,
    Unenforced,
    WaitReason,
)
from .states import BACKOFF, NEEDS_PLACEMENT, TERMINAL, TaskState
from .store import (
    ACTIONS,
    Conflict,
    CorruptIntent,
    CorruptPolicy,
    CorruptTask,
    NotFound,
    Store,
    StoreError,
    StoreFull,
    format_task_id,
    parse_task_id,
)

__all__ = [
    "ACTIONS",
    "BACKOFF",
    "NEEDS_PLACEMENT",
    "TERMINAL",
    "Conflict",
    "CorruptIntent",
    "CorruptPolicy",
    "CorruptTask",
    "Event",
    "HeldGpu",
    "Intent",
    "NotFound",
    "Owner",
    "Placement",
    "PolicyRecord",
    "Store",
    "StoreError",
    "StoreFull",
    "TaskRecord",
    "TaskState",
    "TaskSummary",
    "Unenforced",
    "WaitReason",
    "format_task_id",
    "parse_task_id",
]
