"""A small Python layer over `xhagent._bpf` (libbpf): objects, programs, maps, links,
ring buffers and perf events, with failures raised as OSError carrying the errno and
what libbpf logged about it.

Objects ship as package data in `objects/<name>.bpf.o` (built from `ebpf/*.bpf.c`).
"""

from __future__ import annotations

import errno as _errno
import struct
from collections.abc import Iterator
from pathlib import Path

from ..errors import KernelError, errno_reason
from .layout import EXPORT_SECTION

OBJECTS = Path(__file__).resolve().with_name("objects")

PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0


class BpfError(KernelError):
    """OSError(errno, "STEP: -ENAME (strerror): libbpf: LOG")."""


# libbpf's own error codes (libbpf.h, enum libbpf_errno), returned like errnos.
_LIBBPF_ERRNO = [
    "LIBELF",
    "FORMAT",
    "KVERSION",
    "ENDIAN",
    "INTERNAL",
    "RELOC",
    "LOAD",
    "VERIFY",
    "PROG2BIG",
    "KVER",
    "PROGTYPE",
    "WRNGPID",
    "INVSEQ",
    "NLPARSE",
]


def _libbpf_reason(code: int, step: str) -> str | None:
    """`STEP: -LIBBPF_ERRNO__NAME (libbpf's text)` for libbpf's own codes, else None."""
    if not 4000 <= code < 4000 + len(_LIBBPF_ERRNO):
        return None
    text = "libbpf error"
    if _lib is not None:
        buf = _ffi.new("char[]", 128)
        _lib.libbpf_strerror(code, buf, 128)
        text = _ffi.string(buf).decode(errors="replace")
    return errno_reason(code, step, name=f"LIBBPF_ERRNO__{_LIBBPF_ERRNO[code - 4000]}", text=text)


def format_error(step: str, err: int, log: str = "") -> str:
    text = _libbpf_reason(abs(err), step) or errno_reason(err, step)
    lines = (line.strip().removeprefix("libbpf: ") for line in log.strip().splitlines())
    log = " | ".join(line for line in lines if line)
    if len(log) > 600:  # the tail names the failure; the verifier log can be huge
        log = "..." + log[-600:]
    return f"{text}: libbpf: {log}" if log else text


_lib = _ffi = None


def binding():
    """(ffi, lib) of the compiled extension, with libbpf's log captured."""
    global _lib, _ffi
    if _lib is None:
        try:
            from xhagent._bpf import ffi, lib
        except ImportError as exc:
            raise BpfError(
                _errno.ENOSYS,
                f"xhagent._bpf is not built ({exc}): "
                "reinstall the package (pip install .) with libbpf-dev present",
            ) from None
        lib.xh_log_capture(1)
        _ffi, _lib = ffi, lib
    return _ffi, _lib


def _log() -> str:
    ffi, lib = binding()
    buf = ffi.new("char[]", 8192)
    n = lib.xh_log_take(buf, 8192)
    text = ffi.string(buf, n).decode(errors="replace") if n else ""
    # libbpf notes at every open that it skips the section of XH_BTF_EXPORT's BTF-only
    # anchors (ebpf/maps.bpf.h); that is by design and no part of any failure.
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not ("skipping" in line and EXPORT_SECTION in line)
    )


def _fresh() -> None:
    """Forget old warnings so that a failure's message is its own."""
    ffi, lib = binding()
    lib.xh_log_take(ffi.NULL, 0)


def _check(ret: int, step: str) -> int:
    if ret < 0:
        raise BpfError(-ret, format_error(step, ret, _log()))
    return ret


def _check_ptr(ptr, step: str):
    ffi, _ = binding()
    if ptr == ffi.NULL:
        err = ffi.errno or _errno.EINVAL  # strict libbpf: NULL + errno
        raise BpfError(err, format_error(step, err, _log()))
    return ptr


def object_path(name: str) -> Path:
    path = OBJECTS / f"{name}.bpf.o"
    if not path.is_file():
        raise BpfError(
            _errno.ENOENT,
            f"BPF object {path.name} not found in {OBJECTS}: build it "
            "with `python3 ebpf/build.py` or reinstall the package",
        )
    return path


def possible_cpus() -> int:
    _, lib = binding()
    return _check(lib.libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


def perf_event_open(
    type_: int,
    config: int,
    *,
    pid: int = 0,
    cpu: int = -1,
    sample_period: int = 0,
    sample_freq: int = 0,
    disabled: bool = True,
) -> int:
    """perf_event_open(2) -> fd (close-on-exec). Program.attach_perf_event enables a
    disabled event and its link then owns the fd (destroying the link closes it)."""
    _, lib = binding()
    freq = sample_freq > 0
    fd = lib.xh_perf_event_open(
        type_, config, pid, cpu, sample_freq if freq else sample_period, int(freq), int(disabled)
    )
    if fd < 0:
        raise BpfError(
            -fd,
            format_error(
                f"perf_event_open(type={type_}, config={config}, pid={pid}, cpu={cpu})", fd
            ),
        )
    return fd


class Link:
    def __init__(self, ptr, what: str):
        self._ptr, self.what = ptr, what

    def destroy(self) -> None:
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            binding()[1].bpf_link__destroy(ptr)


class Program:
    def __init__(self, obj: BpfObject, ptr):
        self._obj, self._ptr = obj, ptr
        ffi, lib = binding()
        self.name = ffi.string(lib.bpf_program__name(ptr)).decode()
        self.section = ffi.string(lib.bpf_program__section_name(ptr)).decode()

    @property
    def fd(self) -> int:
        return binding()[1].bpf_program__fd(self._ptr)

    def set_autoload(self, on: bool) -> None:
        _check(binding()[1].bpf_program__set_autoload(self._ptr, on), f"set autoload {self.name}")

    def attach(self) -> Link:
        """Attach by section name (tp_btf/..., raw_tp/..., ...)."""
        _fresh()
        return self._link(binding()[1].bpf_program__attach(self._ptr), f"attach {self.section}")

    def attach_raw_tracepoint(self, tp: str) -> Link:
        _fresh()
        lib = binding()[1]
        return self._link(
            lib.bpf_program__attach_raw_tracepoint(self._ptr, tp.encode()), f"attach raw_tp/{tp}"
        )

    def attach_perf_event(self, pfd: int) -> Link:
        _fresh()
        lib = binding()[1]
        return self._link(
            lib.bpf_program__attach_perf_event(self._ptr, pfd),
            f"attach {self.section} to perf event fd {pfd}",
        )

    def _link(self, ptr, what: str) -> Link:
        link = Link(_check_ptr(ptr, what), what)
        self._obj._links.append(link)
        return link


class Map:
    def __init__(self, ptr):
        ffi, lib = binding()
        self._ptr = ptr
        self.name = ffi.string(lib.bpf_map__name(ptr)).decode()
        self.key_size = lib.bpf_map__key_size(ptr)
        self.value_size = lib.bpf_map__value_size(ptr)
        self.max_entries = lib.bpf_map__max_entries(ptr)

    @property
    def fd(self) -> int:
        return binding()[1].bpf_map__fd(self._ptr)

    def lookup(self, key: bytes) -> bytes | None:
        ffi, lib = binding()
        value = ffi.new("char[]", self.value_size)
        ret = lib.bpf_map_lookup_elem(self.fd, key, value)
        if ret == -_errno.ENOENT:
            return None
        _check(ret, f"lookup in map {self.name}")
        return ffi.buffer(value)[:]

    def lookup_percpu(self, key: bytes) -> list[bytes]:
        """One value per possible CPU; the kernel pads each to 8 bytes."""
        ffi, lib = binding()
        ncpu, stride = possible_cpus(), (self.value_size + 7) & ~7
        value = ffi.new("char[]", ncpu * stride)
        _check(lib.bpf_map_lookup_elem(self.fd, key, value), f"lookup in per-CPU map {self.name}")
        raw = ffi.buffer(value)[:]
        return [raw[i * stride : i * stride + self.value_size] for i in range(ncpu)]

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        _check(
            binding()[1].bpf_map_update_elem(self.fd, key, value, flags), f"update map {self.name}"
        )

    def delete(self, key: bytes) -> None:
        _check(binding()[1].bpf_map_delete_elem(self.fd, key), f"delete from map {self.name}")

    def keys(self) -> list[bytes]:
        """Every key of a hash map now (one syscall a key)."""
        ffi, lib = binding()
        out, prev, key = [], ffi.NULL, ffi.new("char[]", self.key_size)
        while lib.bpf_map_get_next_key(self.fd, prev, key) == 0:
            out.append(ffi.buffer(key)[:])
            if len(out) > self.max_entries:  # keys deleted and added meanwhile: enough
                break
            prev = ffi.new("char[]", out[-1])
        return out

    # Our programs use u32-keyed arrays of little-endian integers.
    def get_int(self, index: int) -> int:
        v = self.lookup(struct.pack("<I", index))
        return 0 if v is None else int.from_bytes(v, "little")

    def sum_percpu(self, index: int) -> int:
        return sum(
            int.from_bytes(v, "little") for v in self.lookup_percpu(struct.pack("<I", index))
        )

    def set_u32(self, index: int, value: int) -> None:
        self.update(struct.pack("<I", index), struct.pack("<I", value))


class RingBuffer:
    """Records of a BPF_MAP_TYPE_RINGBUF, collected in C and drained in bulk."""

    def __init__(self, obj: BpfObject, m: Map):
        _, lib = binding()
        self.map = m
        self._ptr = _check_ptr(lib.xh_rb_new(m.fd), f"ring buffer on map {m.name}")
        obj._rings.append(self)

    def drain(self, timeout_ms: int = 0) -> tuple[bytes, int]:
        """Poll (up to timeout_ms; 0 = what is there now) -> (concatenated records, count)."""
        ffi, lib = binding()
        ret = lib.xh_rb_poll(self._ptr, timeout_ms) if timeout_ms else lib.xh_rb_consume(self._ptr)
        if ret == -_errno.EINTR:
            ret = 0
        length, count = ffi.new("size_t *"), ffi.new("uint64_t *")
        data = lib.xh_rb_data(self._ptr, length, count)
        out = ffi.buffer(data, length[0])[:] if length[0] else b""
        n = count[0]
        lib.xh_rb_reset(self._ptr)
        _check(ret, f"poll ring buffer {self.map.name}")
        return out, n

    def free(self) -> None:
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            binding()[1].xh_rb_free(ptr)


def decode(data: bytes, count: int, record: struct.Struct) -> Iterator[tuple]:
    """Fixed-size records from RingBuffer.drain()."""
    if len(data) != count * record.size:
        raise ValueError(
            f"ring buffer returned {len(data)} bytes for {count} records of {record.size} bytes"
        )
    return record.iter_unpack(data)


class BpfObject:
    """An opened (and, by default, loaded) BPF object; closing it detaches everything.

    with BpfObject("sched_count") as obj:
        obj.program("on_switch").attach()
    """

    def __init__(self, name: str, *, path: Path | str | None = None, load: bool = True):
        self.path = Path(path) if path is not None else object_path(name)
        ffi, lib = binding()
        self._links: list[Link] = []
        self._rings: list[RingBuffer] = []
        _fresh()
        self._ptr = _check_ptr(
            lib.bpf_object__open_file(str(self.path).encode(), ffi.NULL), f"open {self.path.name}"
        )
        if load:
            self.load()

    def load(self) -> None:
        _fresh()
        try:
            _check(binding()[1].bpf_object__load(self._ptr), f"load {self.path.name}")
        except BaseException:
            self.close()
            raise

    def program(self, name: str) -> Program:
        ptr = binding()[1].bpf_object__find_program_by_name(self._ptr, name.encode())
        return Program(self, _check_ptr(ptr, f"find program {name} in {self.path.name}"))

    def programs(self) -> list[Program]:
        ffi, lib = binding()
        out, p = [], lib.bpf_object__next_program(self._ptr, ffi.NULL)
        while p != ffi.NULL:
            out.append(Program(self, p))
            p = lib.bpf_object__next_program(self._ptr, p)
        return out

    def map(self, name: str) -> Map:
        ptr = binding()[1].bpf_object__find_map_by_name(self._ptr, name.encode())
        return Map(_check_ptr(ptr, f"find map {name} in {self.path.name}"))

    def ring_buffer(self, map_name: str) -> RingBuffer:
        return RingBuffer(self, self.map(map_name))

    def close(self) -> None:
        for ring in self._rings:
            ring.free()
        for link in reversed(self._links):
            link.destroy()
        self._rings, self._links = [], []
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            binding()[1].bpf_object__close(ptr)

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ProgramLoader:
    """Base of the one-program loaders (sched_count, signal_probe, sched_trace, preempt):
    each owns `self.obj`, a BpfObject, and closing the loader closes it (links included)."""

    obj: BpfObject

    def close(self) -> None:
        self.obj.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
