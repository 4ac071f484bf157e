"""The doctor's data model: a flat list of named items, each ok or not with a reason.

Item names are stable keys (documented in docs/operations.md): scripts read them from
`xhagent doctor --json` and `--require NAME` refers to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Item:
    name: str
    ok: bool
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok}
        if not self.ok:
            out["reason"] = self.reason or "unknown"
        out.update(self.detail)
        return out


def ok(name: str, **detail: Any) -> Item:
    return Item(name, True, None, detail)


def fail(name: str, reason: str, **detail: Any) -> Item:
    return Item(name, False, reason, detail)
