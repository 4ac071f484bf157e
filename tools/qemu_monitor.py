"""Where a wedged guest's CPUs are, asked of QEMU's human monitor (a unix socket).

A guest whose CPUs all spin with interrupts off says nothing by itself: no watchdog runs,
no hung-task report comes, and the test inside it never reaches its own timeout. The
emulator still knows each vCPU's registers and can read guest memory, so when vmtest gives
up on a guest it asks the monitor, for each vCPU, where it is (its instruction pointer,
named by the text symbols of the guest's /proc/kallsyms, saved at boot), whether
interrupts are on, and which kernel text addresses lie on its stack (a poor man's
backtrace: return addresses, and some stale words, innermost first).

    describe(socket_path, symbols_file)
        -> ["vCPU 0: native_safe_halt+0xb (interrupts on, halted)", ...]
"""

from __future__ import annotations

import bisect
import re
import socket
from pathlib import Path

PROMPT = b"(qemu) "
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
KERNEL_TEXT = 0xFFFFFFFF80000000  # x86-64's kernel text mapping starts here
STACK_WORDS = 64
FAR = 1 << 16  # an address this far past its symbol is not in it (data, or a hole)
IF = 0x200  # RFLAGS: interrupts enabled


def ask(path: str | Path, commands: list[str], timeout: float = 5.0) -> list[str]:
    """The monitor's replies to `commands`, in order (terminal escapes and the echoed
    command line removed)."""
    replies = []
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        _until_prompt(s)  # the banner
        for command in commands:
            s.sendall(command.encode() + b"\n")
            reply = _until_prompt(s)
            replies.append(reply.split("\n", 1)[1] if "\n" in reply else "")
    return replies


def _until_prompt(s: socket.socket) -> str:
    buf = b""
    while not buf.endswith(PROMPT):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    text = ANSI.sub(b"", buf).decode(errors="replace").replace("\r", "")
    return text[: -len(PROMPT)] if text.endswith(PROMPT.decode()) else text


def parse_cpus(text: str) -> list[dict]:
    """Each vCPU's number, rip, rsp, rflags, privilege level and halt state from `info
    registers -a`."""
    cpus = []
    for block in text.split("CPU#")[1:]:
        number = re.match(r"\d+", block)
        regs = dict(re.findall(r"\b(RIP|RSP|RFL|CPL|HLT)=([0-9a-f]+)", block))
        if number is None or not {"RIP", "RSP", "RFL", "CPL", "HLT"} <= regs.keys():
            continue
        cpus.append(
            {
                "cpu": int(number.group()),
                "rip": int(regs["RIP"], 16),
                "rsp": int(regs["RSP"], 16),
                "rflags": int(regs["RFL"], 16),
                "cpl": int(regs["CPL"]),
                "halted": regs["HLT"] == "1",
            }
        )
    return cpus


class Symbols:
    """Text symbols in System.map's format (/proc/kallsyms's too: a module's name follows
    its symbols, kept as `name[module]`), for naming kernel addresses."""

    def __init__(self, path: str | Path):
        pairs = []
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in ("t", "T", "w", "W"):
                    pairs.append((int(parts[0], 16), "".join(parts[2:4])))
        pairs.sort()
        self.addrs = [a for a, _ in pairs]
        self.names = [n for _, n in pairs]

    def name(self, addr: int) -> str | None:
        """`symbol+0xoffset` for an address in kernel text, else None."""
        if addr < KERNEL_TEXT:
            return None
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i < 0 or addr - self.addrs[i] >= FAR:
            return None
        return f"{self.names[i]}+{addr - self.addrs[i]:#x}"


def stack_symbols(dump: str, symbols: Symbols) -> list[str]:
    """The kernel text addresses among the words of an `x/Ngx` dump, innermost first, with
    repeats in a row folded."""
    out: list[str] = []
    for word in re.findall(r"0x([0-9a-f]{16})\b", dump):
        name = symbols.name(int(word, 16))
        if name and (not out or out[-1] != name):
            out.append(name)
    return out


def describe(path: str | Path, symbols_file: str | Path | None) -> list[str]:
    """A line per vCPU: where it is, its interrupt and halt state and, in the kernel, the
    text addresses on its stack; or one line saying why the monitor could not tell."""
    try:
        symbols = Symbols(symbols_file) if symbols_file and Path(symbols_file).is_file() else None
        (regs,) = ask(path, ["info registers -a"])
        lines = []
        for cpu in parse_cpus(regs):
            where = (symbols and symbols.name(cpu["rip"])) or f"{cpu['rip']:#x}"
            state = "interrupts on" if cpu["rflags"] & IF else "interrupts off"
            state += ", halted" if cpu["halted"] else ""
            state += ", in user space" if cpu["cpl"] == 3 else ""
            line = f"vCPU {cpu['cpu']}: {where} ({state})"
            if cpu["cpl"] == 0 and symbols is not None:
                _, dump = ask(path, [f"cpu {cpu['cpu']}", f"x/{STACK_WORDS}gx {cpu['rsp']:#x}"])
                frames = stack_symbols(dump, symbols)
                if frames:
                    line += "; kernel text on its stack: " + " < ".join(frames[:16])
            lines.append(line)
        return lines or ["the QEMU monitor gave no vCPU registers"]
    except (OSError, ValueError) as exc:
        return [f"the QEMU monitor did not answer: {exc}"]
