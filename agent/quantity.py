"""Byte quantities: the one rule for every size a user writes, in every file and option.

Ground floor: imports nothing of the agent's packages, so any of them may import it.

The rule is Kubernetes' resource.Quantity, for bytes:

- a plain non-negative integer is bytes (`4096`);
- `k` (or `K`), `M`, `G`, `T`, `P`, `E` are powers of 1000: `16G` = 16 * 10**9;
- `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` are powers of 1024: `16Gi` = 16 * 2**30;
- a trailing `B` changes nothing: `16GB` = `16G`, `16GiB` = `16Gi`, `4096B` = `4096`;
- a decimal fraction is allowed when the result is whole bytes (`3.84TB`, `1.5Gi`),
  and a space may separate number and unit (`512 MiB`);
- case matters (`m` is milli in Kubernetes, so `16m`, `16gb` and `16gib` are refused);
- at most 8 EiB - 1 (2**63 - 1, what a kernel byte count holds); no sign, exponent,
  NaN or infinity, and a YAML float is refused (write `1.5Gi`, not `1.5e9`).

Kernel text is another matter: sysfs and the kernel's memparse read `K`, `M`, `G` as powers
of 1024; `kernel_size` reads that, and only text the kernel wrote.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

MAX_SIZE = 2**63 - 1
DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
UNITS = {"": 1, **DECIMAL, **BINARY}
KiB, MiB, GiB = 2**10, 2**20, 2**30
FORMS = "4096, 512MiB or 64GiB"
_SIZE = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?\s*([A-Za-z]*)\s*")
# The text of a size as a schema pattern (the CRDs'): _SIZE with the units spelled out.
SIZE_PATTERN = (
    "^"
    + _SIZE.pattern.replace(
        "([A-Za-z]*)", "(" + "|".join(sorted(UNITS, key=len, reverse=True)) + ")B?"
    )
    + "$"
)
_KERNEL = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Output units, largest first; binary first on a tie (16GiB, not 17179869184).
_OUT = sorted(((s, u) for u, s in BINARY.items()), reverse=True) + sorted(
    ((s, u) for u, s in DECIMAL.items() if u != "K"), reverse=True
)


def parse_size(value: Any, forms: str = FORMS) -> int:
    """A size as a user wrote it (YAML int or text) -> int bytes; ValueError with the reason.
    `forms` is the example list of the "expected a size such as ..." message."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected a size such as {forms}, got {kind_of(value)}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value} is negative")
        size = value
    else:
        m = _SIZE.fullmatch(value)
        if not m:
            raise ValueError(f"expected a size such as {forms}, got {value!r}")
        whole, frac, unit = m.group(1).lstrip("0"), (m.group(2) or "").rstrip("0"), m.group(3)
        scale = UNITS.get(unit[:-1] if unit.endswith("B") else unit)
        if scale is None:
            raise ValueError(
                f"expected a size such as {forms}, got {abbreviate(value)!r} (units: k M G T P E, "
                "Ki Mi Gi Ti Pi Ei, optionally with B; case matters)"
            )
        # Exact arithmetic on bounded text: a 400-digit size is "larger", never an OverflowError.
        if len(whole) > 20:
            raise ValueError(f"size {abbreviate(value)} is larger than 8 EiB")
        if len(frac) > 64:
            raise ValueError(f"size {abbreviate(value)} is not a whole number of bytes")
        exact = (int(whole or "0") + Fraction(int(frac or "0"), 10 ** len(frac))) * scale
        if exact.denominator != 1:
            raise ValueError(f"size {abbreviate(value)} is not a whole number of bytes")
        size = int(exact)
    if size > MAX_SIZE:
        raise ValueError(f"size {abbreviate(value)} is larger than 8 EiB")
    return size


def format_size(n: int) -> str | int:
    """The canonical text of `n` bytes, parsed back to `n`: the exact form with the fewest
    digits (`16GiB`, `16GB`, `1500kB`), binary on a tie; plain bytes otherwise (an int)."""
    for scale, unit in sorted(
        _OUT, key=lambda su: len(str(n // su[0])) if n and n % su[0] == 0 else 99
    ):
        if n and n % scale == 0:
            return f"{n // scale}{unit}B"
    return n


def human(n: int, places: int = 2) -> str:
    """Text for people: exact in a unit when it is (`16 GiB`, `16 GB`), else the largest
    binary unit to `places` decimals (`12.5 GiB`, `79.6 GiB`, `512 B`)."""
    exact = format_size(n)
    if isinstance(exact, str):
        number, unit = re.fullmatch(r"(\d+)(\D+)", exact).groups()
        if len(number) <= 4:
            return f"{number} {unit}"
    for scale, unit in sorted(((s, u) for u, s in BINARY.items()), reverse=True):
        if n >= scale:
            return f"{n / scale:.{places}f}".rstrip("0").rstrip(".") + f" {unit}B"
    return f"{n} B"


def kernel_size(text: str | None) -> int:
    """Sizes as the kernel writes them (sysfs cache `size`: `48K`, `32768K`, `1M`): K, M, G
    and T are powers of 1024 there. Not for anything a user wrote."""
    if not text or not text.strip():
        return 0
    t = text.strip()
    unit = t[-1].upper() if t[-1].isalpha() else ""
    return int(t[: len(t) - len(unit)]) * _KERNEL.get(unit, 1)


def abbreviate(value: Any) -> str:
    """A value for a message: at most 24 characters, or the head and the length."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"


_KINDS = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def kind_of(value: Any, other: str = "a {}") -> str:
    """What a user wrote, in words: never a Python repr such as datetime.date(2024, 1, 1).
    A type outside the table is named by `other` filled with the type's name (spec.py's
    messages say `got date` where this module's say `got a date`)."""
    return _KINDS.get(type(value)) or other.format(type(value).__name__)
