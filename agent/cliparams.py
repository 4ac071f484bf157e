"""Command-line value types shared by every subcommand.

click's FloatRange lets NaN through (every comparison with NaN is false) and accepts
infinity, so `--seconds nan` ran a benchmark forever and `--timeout nan` froze a group
with no deadline. Numbers that bound time or size go through `FiniteFloat`.
"""

from __future__ import annotations

import math

import click


class FiniteFloat(click.ParamType):
    """A finite float in (lo, hi] (or [lo, hi] with `lo_open=False`)."""

    name = "float"

    def __init__(self, lo: float, hi: float, lo_open: bool = True, unit: str = ""):
        self.lo, self.hi, self.lo_open, self.unit = lo, hi, lo_open, unit

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value} is not a finite number", param, ctx)
        low_ok = number > self.lo if self.lo_open else number >= self.lo
        if not low_ok or number > self.hi:
            lo = f"{'>' if self.lo_open else '>='} {self.lo:g}"
            self.fail(
                f"{number:g} is out of range: must be {lo} and <= {self.hi:g}{self.unit}",
                param,
                ctx,
            )
        return number
