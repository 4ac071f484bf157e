"""Human and JSON renderings of a doctor report."""

from __future__ import annotations

import json
from typing import Any

from .report import Item

SCHEMA = 1


def to_json(items: list[Item]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "items": {i.name: i.to_json() for i in items},
        "ok": [i.name for i in items if i.ok],
        "missing": [i.name for i in items if not i.ok],
    }


def dumps(items: list[Item]) -> str:
    return json.dumps(to_json(items), indent=2, sort_keys=False)


def _summary(detail: dict[str, Any]) -> str:
    parts = []
    for key, value in detail.items():
        if isinstance(value, (list, tuple)) and len(value) > 8:
            value = f"({len(value)}, listed by --json)"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value) if value else "-"
        elif isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items())
        parts.append(f"{key}={value}")
    return " ".join(parts)


def table(items: list[Item]) -> str:
    width = max((len(i.name) for i in items), default=4)
    lines = [f"{'ITEM':<{width}}  {'OK':4}  DETAIL / REASON"]
    for i in items:
        text = _summary(i.detail) if i.ok else i.reason or ""
        if not i.ok and i.detail:
            text = f"{text}  [{_summary(i.detail)}]"
        lines.append(f"{i.name:<{width}}  {'ok' if i.ok else 'NO':4}  {text}")
    return "\n".join(lines)
