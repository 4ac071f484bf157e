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


class Text(click.ParamType):
    """A string an agent request carries: UTF-8 (argv bytes that are not arrive as lone
    surrogates, which no request can hold), at most `max_bytes`, printable when `printable`
    (an id or name echoed back to a terminal), not empty when `required`."""

    name = "text"

    def __init__(self, max_bytes: int, *, printable: bool = False, required: bool = False):
        self.max_bytes, self.printable, self.required = max_bytes, printable, required

    def convert(self, value, param, ctx) -> str:
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            self.fail("not valid UTF-8", param, ctx)
        if self.required and not value:
            self.fail("must not be empty", param, ctx)
        if size > self.max_bytes:
            self.fail(f"at most {self.max_bytes} bytes (this one has {size})", param, ctx)
        if self.printable and not value.isprintable():
            self.fail("must be printable text", param, ctx)
        return value


def shown_path(path: str) -> str:
    """A file name as UTF-8 text for messages: bytes that are not UTF-8 shown as U+FFFD."""
    return path.encode(errors="surrogateescape").decode(errors="replace")


class InputFile(click.Path):
    """A file to read (`-`: standard input); an empty name is a usage error naming the
    option, not `:1:1: cannot read` about nothing."""

    def __init__(self):
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        if value == "":
            self.fail("an empty file name", param, ctx)
        return super().convert(value, param, ctx)
