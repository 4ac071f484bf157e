"""tools/qemu_monitor.py: a wedged guest's vCPUs described from QEMU's human monitor: the
registers parsed, addresses named by a System.map, the kernel text on each stack, over a
real unix socket served the way QEMU 7.2's monitor answers (echo, escapes, prompt)."""

import socket
import threading

from tool_scripts import ROOT, load_script

mon = load_script("qemu_monitor", ROOT / "tools" / "qemu_monitor.py")

SYSTEM_MAP = """\
ffffffff81000000 T _stext
ffffffff81a2b3a0 T native_safe_halt
ffffffff81a2b3c0 t default_idle
ffffffff810f6b00 T native_queued_spin_lock_slowpath
ffffffff8130c200 T ioc_rqos_throttle
ffffffff82000000 D some_data
ffffffffc0a01000 t null_handle_cmd	[null_blk]
"""


def registers(cpu, rip, rsp, rfl, cpl, hlt):
    return (
        f"CPU#{cpu}\nRAX=0000000000000000 RBX=0000000000000001 RCX=0 RDX=0\n"
        f"RSI=0000000000000000 RDI=0000000000000000 RBP=0000000000000000 RSP={rsp:016x}\n"
        f"RIP={rip:016x} RFL={rfl:08x} [---Z-P-] CPL={cpl} II=0 A20=1 SMM=0 HLT={hlt}\n"
        "ES =0000 0000000000000000 00000000 00000000\n"
    )


REGS = registers(0, 0xFFFFFFFF81A2B3AB, 0xFFFFC90000013E80, 0x246, 0, 1) + registers(
    1, 0xFFFFFFFF810F6B42, 0xFFFFC9000063FD58, 0x046, 0, 0
)
STACK = (
    "ffffc9000063fd58: 0xffffffff8130c25e 0x0000000000000000\n"
    "ffffc9000063fd68: 0xffff888003a1c000 0xffffffff8130c25e\n"
    "ffffc9000063fd78: 0xffffffff810f6b42 0xffffffff82000010\n"
)


def serve(path, replies, seen):
    """A monitor on `path` for one connection at a time: its banner, then per command line
    the echo QEMU's readline makes (with escapes), the canned reply and the prompt."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen()

    def loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) ")
                buf = b""
                while True:
                    data = conn.recv(4096)
                    if not data:
                        break
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        command = line.decode()
                        seen.append(command)
                        echo = b"i\x1b[K\x1b[D" + line + b"\x1b[K\r\n"
                        reply = replies(command).replace("\n", "\r\n").encode()
                        conn.sendall(echo + reply + b"(qemu) ")

    threading.Thread(target=loop, daemon=True).start()
    return srv


def test_registers_are_parsed_per_vcpu():
    cpus = mon.parse_cpus("garbage before\n" + REGS)
    assert [c["cpu"] for c in cpus] == [0, 1]
    assert cpus[0]["rip"] == 0xFFFFFFFF81A2B3AB and cpus[0]["halted"] and cpus[0]["cpl"] == 0
    assert cpus[1]["rflags"] & mon.IF == 0 and not cpus[1]["halted"]
    assert cpus[1]["rsp"] == 0xFFFFC9000063FD58


def test_addresses_are_named_by_the_system_map(tmp_path):
    path = tmp_path / "System.map"
    path.write_text(SYSTEM_MAP)
    symbols = mon.Symbols(path)
    assert symbols.name(0xFFFFFFFF81A2B3AB) == "native_safe_halt+0xb"
    assert symbols.name(0xFFFFFFFF81A2B3C0) == "default_idle+0x0"
    assert symbols.name(0xFFFFFFFFC0A01010) == "null_handle_cmd[null_blk]+0x10"  # a module's
    assert symbols.name(0x00007F0000001000) is None  # user space
    assert symbols.name(0xFFFFFFFF81000000 + mon.FAR + 0x10) is None  # far from _stext
    assert mon.stack_symbols(STACK, symbols) == [
        "ioc_rqos_throttle+0x5e",
        "native_queued_spin_lock_slowpath+0x42",
    ]


def test_describe_asks_the_monitor_for_registers_and_stacks(tmp_path):
    (tmp_path / "System.map").write_text(SYSTEM_MAP)
    seen = []

    def replies(command):
        if command == "info registers -a":
            return REGS
        if command.startswith("x/"):
            return (
                STACK if command.endswith("0xffffc9000063fd58") else "ffffc90000013e80: 0x0 0x0\n"
            )
        return ""

    sock = tmp_path / "monitor.sock"
    srv = serve(sock, replies, seen)
    try:
        lines = mon.describe(sock, tmp_path / "System.map")
    finally:
        srv.close()
    assert lines == [
        "vCPU 0: native_safe_halt+0xb (interrupts on, halted)",
        "vCPU 1: native_queued_spin_lock_slowpath+0x42 (interrupts off); kernel text on its "
        "stack: ioc_rqos_throttle+0x5e < native_queued_spin_lock_slowpath+0x42",
    ]
    assert seen == [
        "info registers -a",
        "cpu 0",
        "x/64gx 0xffffc90000013e80",
        "cpu 1",
        "x/64gx 0xffffc9000063fd58",
    ]


def test_a_monitor_that_is_not_there_is_said_so(tmp_path):
    lines = mon.describe(tmp_path / "absent.sock", None)
    assert len(lines) == 1 and lines[0].startswith("the QEMU monitor did not answer:")
