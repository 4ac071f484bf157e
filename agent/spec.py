"""YAML documents with positions, and a cursor to validate them field by field.

Policy files, task specs and node models are read through here so that every error a
user can cause reads `FILE:LINE:COL: message`: values stay plain Python (dicts, lists,
scalars) and the position of each one is kept beside them, keyed by its path
(`("spec", "groups", 0, "io", "weight")`).

    for doc in load_file(path):
        spec = doc.root.mapping({"apiVersion", "kind", "metadata", "spec"}, required={"kind"})
        weight = spec["spec"]["io"]["weight"].int(1, 10000, default=100)

Every loader gets the same protections here, so no input can cost more than its size: files
are read through `xhagent.inputs` (regular files, FIFOs and `-` only, at most `MAX_BYTES`),
must be UTF-8, may not use YAML aliases (a few hundred bytes of them expand to gigabytes),
may not nest deeper than `MAX_DEPTH`, and numbers must be finite and fit in 64 bits. Each
refusal is a located SpecError like any other mistake.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

try:
    from yaml.cyaml import CParser
except ImportError:  # PyYAML built without libyaml: its own parser alone
    CParser = None

from .inputs import InputError, read_input
from .quantity import kind_of

T = TypeVar("T")
# The input limits, the same for every reader (`policy validate`, `submit`, `apply`, the
# agent's own parse of what it is sent): a file (one submission) of at most MAX_BYTES, at
# most MAX_DOCUMENTS documents in it, each at most MAX_DOCUMENT_BYTES.
MAX_BYTES = 4 << 20  # the largest spec file: far above any real policy or node model
MAX_DOCUMENTS = 10_000
MAX_DOCUMENT_BYTES = 1 << 20
MAX_DEPTH = 128  # nesting levels: a node model uses ten, 32 levels of cgroups about 70
MAX_INT = 1 << 64  # integers beyond this are refused where they are read
SHOWN_CHARS = 512  # at most this much of a value is quoted back in a message
Path_ = tuple[Any, ...]
MISSING: Any = type(
    "Missing", (), {"__repr__": lambda self: "MISSING", "__bool__": lambda self: False}
)()


class SpecError(ValueError):
    """A user error in an input file, located to the character."""

    def __init__(self, file: str, line: int, col: int, message: str):
        super().__init__(f"{file}:{line}:{col}: {message}")
        self.file, self.line, self.col, self.message = file, line, col, message


class YamlSyntaxError(SpecError):
    """Text that is not YAML at all (an unclosed bracket, bad indentation)."""


class SpecErrors(SpecError):
    """Every located error found in one input, in file order; reads as one line per error,
    the first `SHOWN` of them, then a summary line when there are more."""

    SHOWN = 20

    def __init__(self, errors: list[SpecError], total: int | None = None):
        errors = sorted(errors, key=lambda e: (e.file, e.line, e.col))
        first = errors[0]
        super().__init__(first.file, first.line, first.col, first.message)
        self.errors, self.total = errors, max(total or 0, len(errors))
        lines = [str(e) for e in errors[: self.SHOWN]]
        if self.total > len(lines):
            lines.append(
                f"{first.file}: {self.total} errors in all, "
                f"{self.total - len(lines)} more not shown"
            )
        self.args = ("\n".join(lines),)


class ErrorList:
    """Errors gathered while validating, so one run reports all of them.

    `with errors.collecting(): ...` keeps a SpecError raised inside the block and goes on
    after it; `raise_if_any()` raises them together as SpecErrors. Memory stays bounded:
    only the first `KEPT` are stored, the rest are counted.
    """

    KEPT = 200

    def __init__(self) -> None:
        self.errors: list[SpecError] = []
        self.total = 0

    def add(self, exc: SpecError) -> None:
        for e in exc.errors if isinstance(exc, SpecErrors) else [exc]:
            if any(str(k) == str(e) for k in self.errors[-8:]):
                continue  # one mistake seen twice (a missing field, then its missing value)
            self.total += 1
            if len(self.errors) < self.KEPT:
                self.errors.append(e)
        if isinstance(exc, SpecErrors):
            self.total += exc.total - len(exc.errors)

    def collecting(self) -> _Collecting:
        return _Collecting(self)

    def __bool__(self) -> bool:
        return self.total > 0

    def raise_if_any(self) -> None:
        if self.total:
            raise SpecErrors(self.errors, self.total)


class _Collecting:
    """`ErrorList.collecting()`: a class, not a generator, as every field's check is in one."""

    __slots__ = ("errors",)

    def __init__(self, errors: ErrorList):
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, SpecError):
            self.errors.add(exc)
            return True
        return False


@dataclass
class Document:
    file: str
    value: Any
    positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    index: int = 0  # which document of a multi-document file
    errors: ErrorList = field(default_factory=ErrorList)
    # The source text of plain scalars that YAML turned into something else (12.10 -> 12.1):
    # a version must be read as written.
    texts: dict[Path_, str] = field(default_factory=dict)
    # This document's own YAML text, cut out of its file from the start of the line its
    # value begins on (so that its indentation holds): what a multi-document submission
    # keeps of each task, and parses again alone.
    text: str = ""

    def collecting(self):
        """A unit of validation whose SpecError is kept in `errors` (see ErrorList)."""
        return self.errors.collecting()

    def attempt(self, fn: Callable[[], T], default: Any = None) -> T:
        """`fn()`, or `default` when it raises a SpecError, which is kept in `errors`."""
        try:
            return fn()
        except SpecError as exc:
            self.errors.add(exc)
            return default

    def position(self, path: Path_) -> tuple[int, int]:
        """(line, col), 1-based, of the value at `path`, or of its nearest existing parent."""
        while path not in self.positions and path:
            path = path[:-1]
        return self.positions.get(path, (1, 1))

    def error(self, path: Path_, message: str) -> SpecError:
        return SpecError(self.file, *self.position(path), message)

    @property
    def root(self) -> Cursor:
        return Cursor(self, (), self.value)


def _at(file: str, mark: yaml.Mark | None, message: str) -> SpecError:
    return (
        SpecError(file, mark.line + 1, mark.column + 1, message)
        if mark
        else SpecError(file, 1, 1, message)
    )


def _build(node: yaml.Node, path: Path_, doc: Document) -> Any:
    doc.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _at(doc.file, key_node.start_mark, "a mapping key must be a plain value")
            key = _scalar(key_node, doc)
            if key in out:
                raise _at(doc.file, key_node.start_mark, f"duplicate key {key_node.value!r}")
            out[key] = _build(value_node, (*path, key), doc)
            # A key's own position, for messages about the key (unknown field, ...).
            doc.positions[(*path, key, "<key>")] = (
                key_node.start_mark.line + 1,
                key_node.start_mark.column + 1,
            )
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), doc) for i, item in enumerate(node.value)]
    try:
        value = _scalar(node, doc)
    except SpecError as exc:  # a value no loader may see; the other values are still checked
        doc.errors.add(exc)
        return None
    if node.style is None and not isinstance(value, str):
        doc.texts[path] = node.value
    return value


_constructor = yaml.SafeLoader("")


def _scalar(node: yaml.ScalarNode, doc: Document) -> Any:
    try:
        value = _constructor.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        # `2026-13-45` (a date), `!!python/name:...`, an int past Python's digit limit
        problem = getattr(exc, "problem", None) or str(exc)
        raise _at(
            doc.file, node.start_mark, f"invalid value {node.value[:40]!r}: {problem}"
        ) from None
    finally:
        # The constructor keeps every node it built, keyed by the node, until its document
        # is done; one shared across documents would keep every value ever parsed (a daemon
        # that parses each submission would grow for ever).
        _constructor.constructed_objects.pop(node, None)
        _constructor.recursive_objects.pop(node, None)
    if isinstance(value, float) and not math.isfinite(value):
        raise _at(doc.file, node.start_mark, f"{node.value[:40]!r} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT < value < MAX_INT:
        raise _at(
            doc.file,
            node.start_mark,
            f"{node.value[:40]}... is too large (at most 64 bits)"
            if len(node.value) > 40
            else f"{node.value} is too large (at most 64 bits)",
        )
    return value


class _Guarded:
    """A composer refusing aliases and deep nesting before they cost memory or stack."""

    file: str
    depth: int

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _at(
                self.file,
                event.start_mark,
                f"YAML aliases (*{event.anchor}) are not supported: write the value out",
            )
        if self.depth >= MAX_DEPTH:
            raise _at(self.file, event.start_mark, f"nested more than {MAX_DEPTH} levels deep")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Composer(_Guarded, yaml.SafeLoader):
    """PyYAML's own scanner and parser: the reference, and every error message."""

    def __init__(self, text: str, file: str):
        super().__init__(text)
        self.file, self.depth = file, 0


class _NotAlike(Exception):
    """Something the two parsers may read apart: PyYAML reads the text instead."""


class _FastComposer(_Guarded, yaml.composer.Composer, yaml.resolver.Resolver, CParser or object):
    """The same composer over libyaml's scanner and parser (PyYAML's C binding), about ten
    times faster. Used only where both read a text alike: texts without what `_NOT_ALIKE`
    matches, and documents without an empty value (libyaml marks one where its next token
    starts, PyYAML where the text before it ends); and only when it finds no error, so that
    what is refused is refused with PyYAML's message. Its marks count characters, as
    PyYAML's do. tests/unit/test_spec_fast_parse.py holds the two to it."""

    def __init__(self, text: str, file: str):
        CParser.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self.file, self.depth = file, 0

    def compose_scalar_node(self, anchor: Any) -> yaml.ScalarNode:
        node = super().compose_scalar_node(anchor)
        if node.style == "":  # libyaml's plain style is PyYAML's None
            if not node.value:
                raise _NotAlike
            node.style = None
        return node


# Where the two were seen to read apart: tabs, tags (`!`), explicit keys and `?` in flow
# collections, a block scalar's header running into a comment (`|#`), and the characters
# libyaml is not given or treats otherwise (the line breaks beyond \n and \r, a byte
# order mark, lone surrogates).
_NOT_ALIKE = re.compile("[\t!?\x85\u2028\u2029\ufeff\ud800-\udfff]|[|>][-+0-9]*#")


def _fast_ok(text: str) -> bool:
    return (
        CParser is not None
        and not _NOT_ALIKE.search(text)
        and not yaml.reader.Reader.NON_PRINTABLE.search(text)
    )


def load_text(text: str, file: str = "<string>") -> list[Document]:
    """Every document of a YAML stream; a syntax error becomes a SpecError."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise SpecError(
            file, 1, 1, f"is {size:,} bytes, more than the {MAX_BYTES:,} a file may have"
        )
    if _fast_ok(text):
        try:
            return _compose(_FastComposer, text, file)
        except (yaml.YAMLError, SpecError, _NotAlike):
            pass  # read again: PyYAML's reading, and its message, are the ones that count
    return _compose(_Composer, text, file)


def _compose(composer: type, text: str, file: str) -> list[Document]:
    docs, loader, bad = [], None, ErrorList()
    try:
        loader = composer(text, file)  # (PyYAML's checks the characters first)
        i = 0
        while loader.check_node():
            if i == MAX_DOCUMENTS:
                raise _at(
                    file,
                    loader.peek_event().start_mark,
                    f"more than {MAX_DOCUMENTS:,} documents: split the file",
                )
            node = loader.get_node()
            if node is not None:
                doc = Document(file, None, index=i, text=_own_text(text, node, file))
                doc.value = _build(node, (), doc)
                for exc in doc.errors.errors:
                    bad.add(exc)
                docs.append(doc)
            i += 1
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise YamlSyntaxError(
            file, line, col, f"invalid YAML: {exc.problem or exc.context}"
        ) from None
    except yaml.reader.ReaderError as exc:  # a control character: a binary file
        raise _at(
            file,
            _mark_at(text, exc.position),
            f"not a text file (character U+{exc.character:04X} is not allowed)",
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    bad.raise_if_any()
    return docs


def _own_text(text: str, node: yaml.Node, file: str) -> str:
    """The text of the document whose value is `node`, within MAX_DOCUMENT_BYTES."""
    start = text.rfind("\n", 0, node.start_mark.index) + 1
    own = text[start : node.end_mark.index]
    own = own if own.endswith("\n") else own + "\n"  # a kept block scalar's newlines are its own
    size = len(own.encode("utf-8", "surrogatepass"))
    if size > MAX_DOCUMENT_BYTES:
        raise _at(
            file,
            node.start_mark,
            f"this document is {size:,} bytes, more than the {MAX_DOCUMENT_BYTES:,} one may have",
        )
    return own


def _mark_at(text: str, index: int) -> yaml.Mark:
    line = text.count("\n", 0, index)
    return yaml.Mark("", index, line, index - (text.rfind("\n", 0, index) + 1), None, None)


def decode(data: bytes, file: str) -> str:
    """UTF-8 text, or a SpecError at the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[: exc.start]
        line, start = head.count(b"\n") + 1, head.rfind(b"\n") + 1
        col = len(head[start:].decode("utf-8", "replace")) + 1
        raise SpecError(file, line, col, f"not UTF-8 text (byte 0x{data[exc.start]:02x})") from None


def read_text(path: str | Path) -> str:
    """The text of a file (`-`: standard input): regular or a FIFO, UTF-8, within MAX_BYTES."""
    name = str(path)
    try:
        data = read_input(name, MAX_BYTES, "a spec file")
    except InputError as exc:
        raise SpecError(name, 1, 1, exc.message) from None
    return decode(data, name)


def load_file(path: str | Path) -> list[Document]:
    """Every document of a file, read with read_text."""
    return load_text(read_text(path), str(path))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class Cursor:
    """A value inside a Document together with its path; accessors validate and locate."""

    doc: Document
    path: Path_
    value: Any

    @property
    def present(self) -> bool:
        return self.value is not MISSING

    @property
    def where(self) -> str:
        return ".".join(str(p) for p in self.path) or "document"

    @property
    def text(self) -> str | None:
        """The value as written in the file, for a scalar (`12.10`, not the float 12.1)."""
        if isinstance(self.value, str):
            return self.value
        return self.doc.texts.get(self.path)

    def error(self, message: str) -> SpecError:
        return self.doc.error(self.path, message)

    def __getitem__(self, key: Any) -> Cursor:
        if isinstance(self.value, dict) and key in self.value:
            return Cursor(self.doc, (*self.path, key), self.value[key])
        if isinstance(self.value, list) and isinstance(key, int) and 0 <= key < len(self.value):
            return Cursor(self.doc, (*self.path, key), self.value[key])
        return Cursor(self.doc, (*self.path, key), MISSING)

    # -- structure ------------------------------------------------------------------
    def mapping(self, allowed: Iterable[str] | None = None, required: Iterable[str] = ()) -> Cursor:
        """Check this is a mapping with only `allowed` keys and every `required` one; every
        unknown or missing field is reported at once (SpecErrors)."""
        if not isinstance(self.value, dict):
            raise self.error(f"{self.where}: expected a mapping, got {_kind(self.value)}")
        errors = ErrorList()
        if allowed is not None:
            allowed = list(allowed)
            for key in self.value:
                if key not in allowed:
                    pos = self.doc.positions.get((*self.path, key, "<key>")) or self.doc.position(
                        self.path
                    )
                    errors.add(
                        SpecError(
                            self.doc.file,
                            *pos,
                            f"unknown field {_field(self.path, key)!r}"
                            + did_you_mean(str(key), allowed),
                        )
                    )
        for key in sorted(required):
            if key not in self.value:
                errors.add(self.error(f"missing required field {_field(self.path, key)!r}"))
        errors.raise_if_any()
        return self

    def fields(self, allowed: Iterable[str] | None = None, required: Iterable[str] = ()) -> bool:
        """mapping() with its errors kept in the document's ErrorList, so validation goes on:
        True when this is a mapping whose fields can be read (even with unknown ones)."""
        with self.doc.collecting():
            self.mapping(allowed, required)
        return isinstance(self.value, dict)

    def items(self) -> Iterator[tuple[Any, Cursor]]:
        self.mapping()
        for key in self.value:
            yield key, self[key]

    def seq(self, default: list | None = None) -> list[Cursor]:
        if not self.present and default is not None:
            return []
        if not isinstance(self.value, list):
            raise self.error(f"{self.where}: expected a list, got {_kind(self.value)}")
        return [self[i] for i in range(len(self.value))]

    # -- scalars --------------------------------------------------------------------
    def _get(self, default: Any) -> Any:
        if self.present:
            return self.value
        if default is MISSING:
            raise self.error(f"missing required field {self.where!r}")
        return default

    def str(self, choices: Iterable[str] | None = None, default: Any = MISSING) -> Any:
        value = self._get(default)
        if value is default and not self.present:
            return value
        if not isinstance(value, str):
            raise self.error(f"{self.where}: expected a string, got {_kind(value)}")
        if choices is not None and value not in (choices := list(choices)):
            raise self.error(
                f"{self.where}: {value!r} is not one of {', '.join(choices)}"
                + did_you_mean(value, choices)
            )
        return value

    def int(self, lo: int | None = None, hi: int | None = None, default: Any = MISSING) -> Any:
        value = self._get(default)
        if value is default and not self.present:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{self.where}: expected an integer, got {_kind(value)}")
        return self._in_range(value, lo, hi)

    def number(
        self, lo: float | None = None, hi: float | None = None, default: Any = MISSING
    ) -> Any:
        value = self._get(default)
        if value is default and not self.present:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"{self.where}: expected a number, got {_kind(value)}")
        if isinstance(value, float) and not math.isfinite(value):  # from a caller's data, not YAML
            raise self.error(f"{self.where}: {value} is not a finite number")
        return self._in_range(value, lo, hi)

    def _in_range(self, value: Any, lo: Any, hi: Any) -> Any:
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
        if lo is not None and hi is not None:
            raise self.error(f"{self.where}: {value} is out of range {lo}..{hi}")
        raise self.error(
            f"{self.where}: {value} is "
            + (f"below the minimum {lo}" if hi is None else f"above the maximum {hi}")
        )

    def bool(self, default: Any = MISSING) -> Any:
        value = self._get(default)
        if self.present and not isinstance(value, bool):
            raise self.error(f"{self.where}: expected true or false, got {_kind(value)}")
        return value

    def parse(
        self, fn: Callable[[Any], T], what: str, default: Any = MISSING, as_written: bool = False
    ) -> T:
        """Apply a parser (cpu list, byte size, duration...); its ValueError is located here.
        `as_written`: the parser gets the scalar's source text (versions: `12.10` is not 12.1)."""
        value = self._get(default)
        if not self.present:
            return value
        if as_written and self.text is not None:
            value = self.text
        try:
            return fn(value)
        except (ValueError, TypeError, OverflowError) as exc:
            detail = (
                str(exc) if len(str(exc)) <= SHOWN_CHARS else str(exc)[: SHOWN_CHARS - 3] + "..."
            )
            raise self.error(
                f"{self.where}: {self._shown()} is not a valid {what}: {detail}"
            ) from None

    def _shown(self) -> str:
        """The value for a message: as written in the file, never a Python repr."""
        text = self.text
        if text is None:
            return _kind(self.value)
        text = (
            text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
        )  # a 4 MiB value stays out
        return repr(text) if isinstance(self.value, str) else text


def _field(path: Path_, key: Any) -> str:
    """`spec.matchRules.0.selector`: list indices kept, the same style as `Cursor.where`."""
    return ".".join(str(p) for p in (*path, key))


def _kind(value: Any) -> str:
    if value is MISSING:
        return "nothing"
    return kind_of(value, other="{}")
