"""What the service checks of a request before it acts on it: every field in the range its
meaning allows, or INVALID_ARGUMENT with one line per field that is not, naming it
(`since_seq: at most 9223372036854775807`, `idempotency_key: at most 253 bytes`).

Nothing out of range reaches the store (SQLite integers are int64), a file offset or a loop
that would do something it was never meant to (a list of a million states). Pure: `problems`
takes a request and returns lines; `check` raises them. Strings that are not UTF-8 never get
this far: the transport refuses them while decoding, naming the field too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...spec import MAX_BYTES
from ..store import TaskState
from .limits import INT64_MAX, MAX_ID, MAX_NAME, MAX_OFFSET, MAX_TAIL_LINES, MAX_TEXT
from .transport import InvalidArgument
from .v1 import agent_pb2 as pb

STATES = tuple(s.value for s in TaskState)
POLICY_KINDS = ("SchedulingPolicy", "CgroupPolicy")

Check = Callable[[object], "str | None"]


def text(limit: int, *, required: bool = False, printable: bool = False) -> Check:
    """At most `limit` bytes of UTF-8; `printable` for ids and names a client echoes to a
    terminal (no control characters, NUL included). A document's characters are the
    reader's to judge, with their positions."""

    def check(value: str) -> str | None:
        if required and not value:
            return "must not be empty"
        size = len(value.encode())
        if size > limit:
            return f"at most {limit} bytes (this one has {size})"
        if printable and not value.isprintable():
            return "must be printable text"
        return None

    return check


def at_most(limit: int) -> Check:
    def check(value: int) -> str | None:
        return f"at most {limit} (this one is {value})" if value > limit else None

    return check


def at_least(limit: int) -> Check:
    def check(value: int) -> str | None:
        return f"at least {limit} (this one is {value})" if value < limit else None

    return check


def one_of(choices: Sequence, shown: str) -> Check:
    def check(value) -> str | None:
        return None if value in choices else f"{value!r} is not one of {shown}"

    return check


def states(value: Sequence[str]) -> str | None:
    if len(value) > len(STATES):
        return f"at most {len(STATES)} (this request has {len(value)})"
    unknown = [s for s in value if s not in STATES]
    if unknown:
        return f"{unknown[0][:64]!r} is not a state (one of {', '.join(STATES)})"
    return None


TASK_ID = text(MAX_ID, required=True, printable=True)
DOCUMENT = text(MAX_BYTES)
FILE_NAME = text(MAX_TEXT)

# Per request type, each field that has a range and its check; a field not named has none
# (bools, an unbounded `limit` the service caps itself).
FIELDS: dict[type, tuple[tuple[str, Check], ...]] = {
    pb.SubmitRequest: (
        ("source", DOCUMENT),
        ("file_name", FILE_NAME),
        ("idempotency_key", text(MAX_NAME)),
    ),
    pb.GetRequest: (("id", TASK_ID),),
    pb.ListRequest: (("states", states), ("page_token", text(MAX_ID, printable=True))),
    pb.CancelRequest: (("id", TASK_ID), ("reason", text(MAX_TEXT))),
    pb.WatchRequest: (
        ("since_seq", at_most(INT64_MAX)),
        ("task_id", text(MAX_ID, printable=True)),
    ),
    pb.LogsRequest: (
        ("id", TASK_ID),
        ("stream", one_of(pb.LogStream.values(), "0 (both), 1 (stdout), 2 (stderr)")),
        ("offset", at_most(MAX_OFFSET)),
        ("tail_lines", at_most(MAX_TAIL_LINES)),
        ("since_ns", at_least(0)),
    ),
    pb.ApplyPolicyRequest: (("source", DOCUMENT), ("file_name", FILE_NAME)),
    pb.RemovePolicyRequest: (
        ("kind", one_of(("", *POLICY_KINDS), f"{', '.join(POLICY_KINDS)} or empty")),
        ("name", text(MAX_NAME, required=True, printable=True)),
    ),
    pb.ExplainRequest: (("id", TASK_ID),),
}


def problems(request) -> list[str]:
    """`field: what is wrong` for each field of `request` out of its range, in field order."""
    out = []
    for name, check in FIELDS.get(type(request), ()):
        value = getattr(request, name)
        if (why := check(value)) is not None:
            out.append(f"{name}: {why}")
    return out


def check(request) -> None:
    """InvalidArgument listing every field of `request` out of range; nothing when none is."""
    if found := problems(request):
        raise InvalidArgument("\n".join(found))


__all__ = ["FIELDS", "check", "problems"]
