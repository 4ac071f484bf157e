"""Task classes: each class's (cpu.weight, io.weight), built in and as CgroupPolicies define
them. Pure: the scheduler checks a task's class against the table, the executor writes the
weights into its leaf."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Class -> (cpu.weight, io.weight). The kernel's default weight is 100: batch work gets it,
# latency-sensitive work ten times as much, best-effort work a tenth.
CLASS_WEIGHTS: dict[str, tuple[int, int]] = {
    "latency": (1000, 1000),
    "batch": (100, 100),
    "besteffort": (10, 10),
}
DEFAULT_WEIGHT = 100


def class_weights(name: str, classes: Mapping[str, tuple[int, int]] = CLASS_WEIGHTS):
    """(cpu.weight, io.weight) of a class; KeyError with the known names when undefined."""
    try:
        return classes[name]
    except KeyError:
        raise KeyError(
            f"class {name!r} is not defined (defined: {', '.join(sorted(classes))})"
        ) from None


def class_table(policies: Iterable[Mapping[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    """The built-in classes, then each CgroupPolicy's (a later one wins a name)."""
    table = dict(CLASS_WEIGHTS)
    for classes in policies:
        table.update(classes)
    return table
