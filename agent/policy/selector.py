"""Label selectors: `matchLabels` plus `matchExpressions` with In / NotIn / Exists."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import fields
from ..spec import Cursor

OPERATORS = ("In", "NotIn", "Exists")
SELECTOR_FIELDS = ("matchLabels", "matchExpressions")
EXPRESSION_FIELDS, EXPRESSION_REQUIRED = ("key", "operator", "values"), ("key", "operator")
# A label value is text; a YAML number is read as its text (`version: 2`), which the CRD
# takes as an integer too. Not `true`: YAML's booleans are a quoting mistake.
LABEL_VALUE = fields.int_or_string()
SELECTOR = fields.obj(
    {
        "matchLabels": fields.map_of(LABEL_VALUE),
        "matchExpressions": fields.array(
            fields.obj(
                {
                    "key": fields.string(),
                    "operator": fields.string(enum=OPERATORS),
                    "values": fields.array(LABEL_VALUE),
                },
                EXPRESSION_REQUIRED,
            )
        ),
    }
)


@dataclass(frozen=True)
class Expression:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values

    def __str__(self) -> str:
        if self.operator == "Exists":
            return self.key
        return f"{self.key} {'in' if self.operator == 'In' else 'notin'} ({','.join(self.values)})"


@dataclass(frozen=True)
class Selector:
    match_labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs
    match_expressions: tuple[Expression, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            e.matches(labels) for e in self.match_expressions
        )

    def disjoint_from(self, other: Selector) -> bool:
        """True when no label set can match both (the cases a policy author writes on purpose)."""
        mine, theirs = dict(self.match_labels), dict(other.match_labels)
        if any(k in theirs and theirs[k] != v for k, v in mine.items()):
            return True
        for a, b in ((self, other), (other, self)):
            fixed = dict(b.match_labels)
            for e in a.match_expressions:
                if e.key in fixed and not e.matches({e.key: fixed[e.key]}):
                    return True
                for f in b.match_expressions:
                    if (
                        e.key == f.key
                        and e.operator == f.operator == "In"
                        and not set(e.values) & set(f.values)
                    ):
                        return True
        return False

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels] + [
            str(e) for e in self.match_expressions
        ]
        return ",".join(parts) or "<everything>"

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [
                {
                    "key": e.key,
                    "operator": e.operator,
                    **({"values": list(e.values)} if e.operator != "Exists" else {}),
                }
                for e in self.match_expressions
            ]
        return out


def parse_selector(cur: Cursor) -> Selector:
    """A selector; errors of its fields are kept in the document, the first of a kind
    that leaves nothing to read (not a mapping) is raised."""
    if not isinstance(cur.value, dict):
        cur.mapping()  # raises: nothing inside to read
    cur.fields(SELECTOR_FIELDS)
    doc, labels = cur.doc, []
    if cur["matchLabels"].present and cur["matchLabels"].fields():
        for key, value in cur["matchLabels"].items():
            if (v := doc.attempt(partial(_label_value, value))) is not None:
                labels.append((str(key), v))
    exprs = []
    for item in doc.attempt(lambda: cur["matchExpressions"].seq(default=[]), ()):
        if (e := doc.attempt(partial(_expression, item))) is not None:
            exprs.append(e)
    return Selector(tuple(sorted(labels)), tuple(exprs))


def _expression(item: Cursor) -> Expression:
    item.mapping(EXPRESSION_FIELDS, required=EXPRESSION_REQUIRED)
    op = item["operator"].str(OPERATORS)
    values = tuple(_label_value(v) for v in item["values"].seq(default=[]))
    if op == "Exists" and values:
        raise item["values"].error(f"{item['values'].where}: operator Exists takes no values")
    if op != "Exists" and not values:
        raise item.error(f"{item.where}: operator {op} needs a non-empty 'values' list")
    return Expression(item["key"].str(), op, values)


def _label_value(cur: Cursor) -> str:
    if isinstance(cur.value, bool) or not isinstance(cur.value, (str, int, float)):
        raise cur.error(f"{cur.where}: a label value must be a string")
    return str(cur.value)
