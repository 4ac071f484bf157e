"""The known content at the start of the guest's emulated NVMe disk (/dev/nvme0n1).

tools/vmtest writes it into a fresh 64 MiB image before every boot; kernel tests read it
back (for instance with an IOPOLL O_DIRECT read) and compare. Stdlib only: the harness
imports this file by path.

Layout of the first SIZE bytes: HEADER, then a SHA-256 counter stream
(sha256(b"xhagent-vmtest:0"), sha256(b"xhagent-vmtest:1"), ...), cut at SIZE.
Every 32-byte run differs, so a read at the wrong offset or a stale buffer cannot match.
The rest of the image reads as zeros.
"""

import hashlib

HEADER = b"XHAGENT-VMTEST\n"
SIZE = 1 << 20
DISK_SIZE = 64 << 20
# Pinned so that a change of the generator is a deliberate one (tests/unit checks it).
SHA256 = "a2cb1a8e2de13386b960c1dbd7df3dbf7fcaad36d279a01c9563379f3682da0d"


def pattern(length=SIZE):
    """The first `length` bytes (at most SIZE) of the disk."""
    if not 0 <= length <= SIZE:
        raise ValueError(f"length must be within 0..{SIZE}, not {length}")
    out = bytearray(HEADER)
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(b"xhagent-vmtest:%d" % counter).digest()
        counter += 1
    return bytes(out[:length])


def expected(offset, length):
    """The bytes a read of `length` at `offset` returns, zeros past SIZE included."""
    if offset < 0 or length < 0 or offset + length > DISK_SIZE:
        raise ValueError(f"read {offset}+{length} is outside the {DISK_SIZE}-byte disk")
    head = pattern(min(SIZE, offset + length))[offset:]
    return head + bytes(length - len(head))


def write_image(path):
    """Create (or overwrite) a sparse DISK_SIZE image at `path` holding the pattern."""
    with open(path, "wb") as f:
        f.write(pattern())
        f.truncate(DISK_SIZE)
