"""The C types user space shares with a BPF program, seen from both sides.

Each program keeps what user space reads in one header (`ebpf/<program>.h`: record
structs, map value structs, enums) and names those types with XH_BTF_EXPORT, which
puts them into the compiled object's BTF. Python keeps explicit layouts (`Record`, a
`struct.Struct` with C field names) and enum values, declared per program as a
`Mirror`; `read_btf` reads the object's BTF so that a test can check every field
name, offset, size and signedness and every enum value against it
(tests/unit/test_bpf_layout.py). Nothing here runs when a program is loaded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path


class Record(struct.Struct):
    """A C struct as user space packs it: (C field name, struct format code) pairs,
    little endian, no implicit padding (the C struct's padding is a named field).
    An array field has a count: "16s" unpacks to one bytes, "24Q" to 24 ints in place."""

    def __init__(self, c_name: str, fields: tuple[tuple[str, str], ...]):
        super().__init__("<" + "".join(code for _, code in fields))
        self.c_name = c_name
        self.fields = tuple(fields)
        self.names = tuple(name for name, _ in fields)

    def members(self) -> list[tuple[str, int, int, str]]:
        """(name, byte offset, byte size, code) of each field."""
        out, fmt = [], "<"
        for name, code in self.fields:
            size = struct.calcsize("<" + code)
            out.append((name, struct.calcsize(fmt), size, code))
            fmt += code
        return out


@dataclass(frozen=True)
class Mirror:
    """What one module mirrors of a BPF object's header: records and enums
    ({enum name: {enumerator: value}}). A `*_MAX` enumerator (an array size, nothing
    user space reads) may be left out."""

    obj: str  # objects/<obj>.bpf.o
    records: tuple[Record, ...] = ()
    enums: dict[str, dict[str, int]] = field(default_factory=dict)


def pick(namespace: dict, names: str) -> dict[str, int]:
    """{name: namespace[name]} for the space-separated names: a module's constants
    as the enumerators of one C enum."""
    return {name: namespace[name] for name in names.split()}


# --- BTF (include/uapi/linux/btf.h), read from the object's .BTF ELF section --------

BTF_MAGIC = 0xEB9F
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
# Bytes that follow a btf_type, per kind: fixed, and per vlen item.
_EXTRA = {
    INT: (4, 0),
    ARRAY: (12, 0),
    STRUCT: (0, 12),
    UNION: (0, 12),
    ENUM: (0, 8),
    FUNC_PROTO: (0, 8),
    VAR: (4, 0),
    DATASEC: (0, 12),
    DECL_TAG: (4, 0),
    ENUM64: (0, 12),
}
_QUALIFIERS = (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)
EXPORT_SECTION = ".xh_btf"  # XH_BTF_EXPORT's anchors (ebpf/maps.bpf.h)


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # bytes
    size: int  # bytes
    kind: str  # "signed", "unsigned" (integers, enums), "array", "bitfield" (size 0), ...


@dataclass
class Btf:
    structs: dict[str, tuple[int, list[Member]]]  # name -> (size, members)
    enums: dict[str, dict[str, int]]
    exported: list[tuple[str, str]]  # (kind "struct"/"enum", name) of XH_BTF_EXPORT


class BtfError(ValueError):
    pass


def elf_section(path: str | Path, name: str) -> bytes:
    """One section of a little-endian ELF64 file (BPF objects are)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BtfError(f"{path}: not a little-endian ELF64 object")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        name_off, _, _, _, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name_off, off, size

    _, str_off, _ = header(shstrndx)
    for i in range(shnum):
        name_off, off, size = header(i)
        end = data.index(b"\0", str_off + name_off)
        if data[str_off + name_off : end].decode() == name:
            return data[off : off + size]
    raise BtfError(f"{path}: no {name} section")


def read_btf(path: str | Path) -> Btf:
    """The named structs and enums of an object's BTF, and which ones it exports."""
    raw = elf_section(path, ".BTF")
    magic, _, _, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
        "<HBBIIIII", raw
    )
    if magic != BTF_MAGIC:
        raise BtfError(f"{path}: .BTF has magic {magic:#x}, not {BTF_MAGIC:#x}")
    strings = raw[hdr_len + str_off : hdr_len + str_off + str_len]

    def name(off):
        return strings[off : strings.index(b"\0", off)].decode()

    types = [None]  # type id 0 is void
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    while pos < end:
        name_off, info, size_or_type = struct.unpack_from("<III", raw, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        fixed, per_item = _EXTRA.get(kind, (0, 0))
        body = raw[pos + 12 : pos + 12 + fixed + per_item * vlen]
        types.append((kind, name(name_off), size_or_type, bool(info >> 31), vlen, body))
        pos += 12 + len(body)

    def resolve(tid):
        while types[tid][0] in _QUALIFIERS:
            tid = types[tid][2]
        return tid

    def size_of(tid):
        kind, _, size, _, _, body = types[resolve(tid)]
        if kind == PTR:
            return 8
        if kind == ARRAY:
            elem, _, nelems = struct.unpack_from("<III", body)
            return size_of(elem) * nelems
        return size

    def kind_of(tid):
        kind, _, size, _, _, body = types[resolve(tid)]
        if kind == INT:
            return "signed" if (struct.unpack_from("<I", body)[0] >> 24) & 1 else "unsigned"
        if kind in (ENUM, ENUM64):
            return "unsigned"
        return {ARRAY: "array", PTR: "pointer", STRUCT: "struct", UNION: "union"}.get(
            kind, str(kind)
        )

    structs, enums, exported = {}, {}, []
    for kind, tname, size, kflag, vlen, body in types[1:]:
        if kind == STRUCT and tname:
            members = []
            for i in range(vlen):
                m_name, m_type, m_off = struct.unpack_from("<III", body, 12 * i)
                bits, m_off = (m_off >> 24, m_off & 0xFFFFFF) if kflag else (0, m_off)
                if bits or m_off % 8:  # kernel structs have them; a shared record must not
                    members.append(Member(name(m_name), m_off // 8, 0, "bitfield"))
                else:
                    members.append(
                        Member(name(m_name), m_off // 8, size_of(m_type), kind_of(m_type))
                    )
            structs[tname] = (size, members)
        elif kind == ENUM and tname:
            values = {}
            for i in range(vlen):
                e_name, e_val = struct.unpack_from("<Ii", body, 8 * i)
                values[name(e_name)] = e_val if kflag else e_val & 0xFFFFFFFF
            enums[tname] = values
        elif kind == DATASEC and tname == EXPORT_SECTION:
            for i in range(vlen):
                (var,) = struct.unpack_from("<I", body, 12 * i)
                ptr = types[var][2]  # VAR -> PTR -> the exported type
                target = types[resolve(types[ptr][2])]
                label = {STRUCT: "struct", ENUM: "enum"}.get(target[0], f"kind {target[0]}")
                exported.append((label, target[1]))
    return Btf(structs, enums, exported)


def mismatches(btf: Btf, mirror: Mirror) -> list[str]:
    """How `mirror` differs from the object's BTF; empty when they agree."""
    out = []
    for rec in mirror.records:
        if rec.c_name not in btf.structs:
            out.append(f"struct {rec.c_name}: not in {mirror.obj}.bpf.o's BTF")
            continue
        size, members = btf.structs[rec.c_name]
        if rec.size != size:
            out.append(f"struct {rec.c_name}: {size} bytes in C, {rec.size} in Python")
        c_names, py_names = [m.name for m in members], list(rec.names)
        if c_names != py_names:
            out.append(f"struct {rec.c_name}: fields {c_names} in C, {py_names} in Python")
        py = {name: (off, sz, code) for name, off, sz, code in rec.members()}
        for m in members:
            if m.name not in py:
                continue
            off, sz, code = py[m.name]
            if (off, sz) != (m.offset, m.size):
                out.append(
                    f"struct {rec.c_name}.{m.name}: offset {m.offset} size {m.size} in C, "
                    f"offset {off} size {sz} in Python ({code!r})"
                )
            # "16s" is a char array, "24Q" an array of 24 __u64: BTF calls both arrays
            array = code.endswith("s") or code[:-1].isdigit()
            want = "array" if array else "signed" if code.islower() else "unsigned"
            if want != m.kind:
                out.append(
                    f"struct {rec.c_name}.{m.name}: {m.kind} in C, {code!r} ({want}) in Python"
                )
    for enum, values in mirror.enums.items():
        if enum not in btf.enums:
            out.append(f"enum {enum}: not in {mirror.obj}.bpf.o's BTF")
            continue
        c = btf.enums[enum]
        for name in sorted(set(c) | set(values)):
            if name not in values and name.endswith("_MAX"):
                continue
            if c.get(name) != values.get(name):
                out.append(
                    f"enum {enum}: {name} is {c.get(name, 'missing')} in C, "
                    f"{values.get(name, 'missing')} in Python"
                )
    return out
