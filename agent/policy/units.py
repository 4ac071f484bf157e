"""Times in policy and task files: durations and instants, exact to the nanosecond, with a
canonical text form so that parse -> dump -> parse is identity. (Byte sizes, the same in every
file kind, are `xhagent.quantity`'s.) Durations are Go-style
(`1h30m`, `1.5s`, `250ms`, `10us`, `100ns`); instants are RFC 3339 with up to nine
fractional digits (`2026-11-29T17:00:00.123456789Z`, or an offset such as `+08:00`).
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from decimal import Decimal, InvalidOperation

_DURATION_UNITS = {
    "h": 3600 * 10**9,
    "m": 60 * 10**9,
    "s": 10**9,
    "ms": 10**6,
    "us": 10**3,
    "µs": 10**3,
    "ns": 1,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_INSTANT = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|z|[+-]\d\d:\d\d)"
)


def parse_duration_ns(value: object) -> int:
    """`1h30m`, `1.5s`, `250ms`, `100ns` -> nanoseconds (exact); a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 250ms or 1.5s")
    if isinstance(value, (int, float)):
        value = f"{value}s"
    if not isinstance(value, str):
        raise ValueError("expected a duration such as 250ms or 1.5s")
    text = value.strip()
    pos, total = 0, Decimal(0)
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        try:
            total += Decimal(m.group(1)) * _DURATION_UNITS[m.group(2)]
        except InvalidOperation:
            break
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError("expected a duration such as 250ms, 1.5s or 1h30m")
    if total != total.to_integral_value():
        raise ValueError("finer than a nanosecond")
    return int(total)


def format_duration(ns: int) -> str:
    """Canonical: the largest unit that divides exactly (`90s`, `250ms`, `1500001ns`)."""
    for unit in ("h", "m", "s", "ms", "us"):
        scale = _DURATION_UNITS[unit]
        if ns and ns % scale == 0:
            return f"{ns // scale}{unit}"
    return f"{ns}ns"


def parse_instant_ns(value: object) -> int:
    """RFC 3339 text, nanosecond fraction kept -> ns since the epoch."""
    if not isinstance(value, str):
        raise ValueError("expected a time such as 2026-11-29T17:00:00.5Z")
    m = _INSTANT.fullmatch(value.strip())
    if not m:
        raise ValueError("expected a time such as 2026-11-29T17:00:00.123456789Z")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    dt.datetime(y, mo, d, h, mi, s)  # range check: ValueError names the bad field
    if zone not in "Zz" and (int(zone[1:3]) > 23 or int(zone[4:6]) > 59):
        raise ValueError(f"offset {zone} is not a UTC offset (-23:59 to +23:59)")
    offset = (
        0
        if zone in "Zz"
        else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    )
    seconds = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) - offset
    return seconds * 10**9 + int(frac.ljust(9, "0") or 0)


def format_instant(ns: int) -> str:
    seconds, frac = divmod(ns, 10**9)
    text = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{frac:09d}".rstrip("0") if frac else "") + "Z"
