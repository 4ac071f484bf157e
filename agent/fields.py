"""Field declarations that both read a value (through a `spec.Cursor`) and describe it (as
an OpenAPI v3 / JSON schema fragment), so a policy's validator and its Kubernetes CRD
schema come from one declaration.

    PRIORITY = Int(0, 100, default=50)
    PRIORITY.read(spec["priority"])    # what the agent does: 101 -> "out of range 0..100"
    PRIORITY.schema                     # {"type": "integer", "minimum": 0, "maximum": 100, ...}

The schemas are the Kubernetes flavour (structural: every node has a `type`, or is
`x-kubernetes-int-or-string`); `closed()` adds `additionalProperties: false` to every
object for checking a file outside a cluster, where unknown fields are errors as the
agent makes them (a CRD may not say so: the API server prunes unknown fields instead).
What a schema cannot say (a backwards cpu range, a field given twice across list items)
stays with the reader; a schema only ever accepts at least what the reader accepts, save
the spellings JSON cannot carry (packaging/README.md, "Kubernetes").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Schema = dict[str, Any]


# -- schema fragments --------------------------------------------------------------------
def integer(lo: int | None = None, hi: int | None = None) -> Schema:
    return _bounds({"type": "integer"}, lo, hi)


def number(lo: float | None = None, hi: float | None = None) -> Schema:
    return _bounds({"type": "number"}, lo, hi)


def string(
    enum: Iterable[str] | None = None, pattern: str | None = None, max_length: int | None = None
) -> Schema:
    out: Schema = {"type": "string"}
    if enum is not None:
        out["enum"] = list(enum)
    if pattern is not None:
        out["pattern"] = pattern
    if max_length is not None:
        out["maxLength"] = max_length
    return out


def int_or_string(
    lo: int | None = None, hi: int | None = None, pattern: str | None = None
) -> Schema:
    """An integer (bounded by lo..hi) or a string (matching pattern): a size, `max`, a list.
    Kubernetes' one structural form for two types; the bounds apply to integers only and
    the pattern to strings only, as JSON schema defines them."""
    out: Schema = {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
    }
    if pattern is not None:
        out["pattern"] = pattern
    return _bounds(out, lo, hi)


def boolean() -> Schema:
    return {"type": "boolean"}


def one_of_values(values: Iterable[Any]) -> Schema:
    """Any of these JSON values, of mixed types (`true`, `1`, `"1"`): Kubernetes has no typed
    form for that, so the node keeps what it is given and `enum` is the check."""
    return {"x-kubernetes-preserve-unknown-fields": True, "enum": list(values)}


def array(items: Schema, min_items: int | None = None) -> Schema:
    out: Schema = {"type": "array", "items": items}
    if min_items is not None:
        out["minItems"] = min_items
    return out


def map_of(values: Schema) -> Schema:
    """A mapping with keys of the user's choosing (labels, device names)."""
    return {"type": "object", "additionalProperties": values}


def obj(properties: Mapping[str, Schema], required: Iterable[str] = ()) -> Schema:
    out: Schema = {"type": "object", "properties": dict(properties)}
    if required := sorted(required):
        out["required"] = required
    return out


def _bounds(out: Schema, lo: int | None, hi: int | None) -> Schema:
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


def closed(schema: Schema) -> Schema:
    """The schema with `additionalProperties: false` on every object that lists its
    properties: unknown fields refused, as the agent's readers refuse them."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed(out["additionalProperties"])
    if "items" in out:
        out["items"] = closed(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [closed(s) for s in out[key]]
    return out


# -- fields: a reader and its schema together ---------------------------------------------
@dataclass(frozen=True)
class Field:
    """How a value is read (`read(cursor)`, raising a located SpecError) and described."""

    read: Callable[[Any], Any]
    schema: Schema = field(default_factory=dict)


def Int(lo: int | None = None, hi: int | None = None, default: Any = None) -> Field:  # noqa: N802
    schema = integer(lo, hi)
    if default is not None:
        schema["default"] = default
    return Field(lambda c: c.int(lo, hi, **_default(default)), schema)


def Number(lo: float | None = None, hi: float | None = None, default: Any = None) -> Field:  # noqa: N802
    schema = number(lo, hi)
    if default is not None:
        schema["default"] = default
    return Field(lambda c: c.number(lo, hi, **_default(default)), schema)


def Choice(choices: Iterable[str], default: Any = None) -> Field:  # noqa: N802
    choices = tuple(choices)
    schema = string(enum=choices)
    if default is not None:
        schema["default"] = default
    return Field(lambda c: c.str(choices, **_default(default)), schema)


def Str() -> Field:  # noqa: N802
    return Field(lambda c: c.str(), string())


def Bool() -> Field:  # noqa: N802
    return Field(lambda c: c.bool(), boolean())


def Parsed(  # noqa: N802
    fn: Callable[[Any], Any], what: str, schema: Schema, as_written: bool = False
) -> Field:
    """A value a parser reads (a size, a version): the parser's ValueError is located."""
    return Field(lambda c: c.parse(fn, what, as_written=as_written), schema)


def _default(default: Any) -> dict[str, Any]:
    return {} if default is None else {"default": default}
