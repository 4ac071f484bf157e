"""Every client command of the CLI given hostile values for its options and arguments
(negative, huge, NaN, empty, bytes that are not UTF-8, very long), against a real agent:
the exit status is 0, 1 or 2, no output holds a traceback or a Python exception's class
name, and bad input (exit 2) names the option or argument it is about (or the file it names).

Hypothesis draws the cases. Most run in-process through click's CliRunner (the real
commands and the real socket, fast); a smaller share run `xhagent` as a subprocess with the
values as raw argv bytes, where the interpreter's own handling of stdout and stderr is the
real one."""

import os
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_daemon_host import Agent, task_file

from xhagent.cli import main

pytestmark = pytest.mark.host

XHAGENT = os.path.join(os.path.dirname(sys.executable), "xhagent")
CLIENTS = [
    ("submit",),
    ("ps",),
    ("get",),
    ("cancel",),
    ("logs",),
    ("events",),
    ("apply",),
    ("delete", "policy"),
    ("health",),
    ("explain",),
]
# Flags that make a command wait for the task or follow a stream for ever: not inputs.
WAITING = {"follow", "wait", "socket_path", "help"}
CLASS_NAME = re.compile(r"Traceback|<class |\b[A-Z][A-Za-z]*[a-z](Error|Exception|Warning)\b")
IN_PROCESS, SUBPROCESS = 250, 40
RAN = {"in-process": 0, "subprocess": 0}


def command(path: tuple[str, ...]) -> click.Command:
    found = main
    for name in path:
        found = found.get_command(click.Context(found), name)
    return found


MAX_ARG = 128 * 1024 - 1  # bytes of one argv string, its NUL not counted


def hostile(seeded: str) -> st.SearchStrategy[str]:
    """What an adversary passes as one value, as Python sees argv (bytes that are not
    UTF-8 as lone surrogates); argv cannot hold NUL."""
    fixed = ["-5", "-1", "0", "nan", "-inf", "1e308", "", " ", "9" * 30, str(2**63)]
    fixed += [str(2**64), "-", "--", "/", "/dev/zero", "/proc/self/mem", seeded, seeded + "\n"]
    return st.one_of(
        st.sampled_from(fixed),
        st.integers().map(str),
        st.text(max_size=40),
        st.binary(min_size=1, max_size=40).map(os.fsdecode),
        # up to the kernel's limit for one argv string (MAX_ARG_STRLEN, 128 KiB with its
        # NUL): past it execve itself refuses, and no command sees the value
        st.integers(200, MAX_ARG - 1).map(lambda n: "x" * n),
    ).map(lambda v: v.replace("\x00", ""))


@st.composite
def invocation(draw, seeded: str, stdin: bool):
    """(argv, the names a usage error may give) for one client command."""
    path = draw(st.sampled_from(CLIENTS))
    cmd = command(path)
    argv, arguments, names, given = list(path), [], set(), []
    values = hostile(seeded)
    if not stdin:  # `-` reads standard input, which the in-process runner has no fd for
        values = values.filter(lambda v: v != "-")
    for param in cmd.params:
        if param.name in WAITING:
            continue
        if isinstance(param, click.Argument):
            names.add(param.human_readable_name)
            count = draw(st.integers(0, 3)) if param.nargs == -1 else draw(st.integers(0, 1))
            arguments += [draw(values) for _ in range(count)]
            continue
        names.update(param.opts)
        if param.is_flag:
            argv += param.opts[:1] if draw(st.booleans()) else []
        elif draw(st.booleans()):
            given.append(draw(values))
            argv += [draw(st.sampled_from(param.opts)), given[-1]]
    # a file that cannot be read is named by its path, as stderr shows it
    names.update(v.encode(errors="backslashreplace").decode()[:40] for v in arguments + given)
    return argv, arguments, names


def judge(code: int, out: str, err: str, names: set[str], argv) -> None:
    assert code in (0, 1, 2), (argv, code, err[-2000:])
    assert not CLASS_NAME.search(out + err), (argv, err[-2000:])
    if code == 2:
        assert any(n and n in err for n in names), (argv, sorted(names), err[-2000:])


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    a = Agent(base, f"xhagent-fuzz-test-{os.getpid()}.slice")
    a.start()
    a.seeded = a.submit(task_file(base, "seeded", ["true"]))  # a task that exists
    yield a
    a.stop()
    a.remove_subtree()
    print(f"\nCLI fuzz: {RAN['in-process']} in-process and {RAN['subprocess']} subprocess cases")


def test_client_commands_in_process(agent):
    runner = CliRunner()

    @settings(
        max_examples=IN_PROCESS,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(invocation(agent.seeded, stdin=False))
    def case(drawn):
        argv, arguments, names = drawn
        args = [*argv, "--socket", str(agent.socket), "--", *arguments]
        result = runner.invoke(main, args, catch_exceptions=True)
        RAN["in-process"] += 1
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{args[:6]}: {result.exception!r}") from result.exception
        judge(result.exit_code, result.stdout, result.stderr, names, args[:6])

    case()


def test_client_commands_as_a_subprocess_with_raw_argv_bytes(agent):
    @settings(
        max_examples=SUBPROCESS,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(invocation(agent.seeded, stdin=True))
    def case(drawn):
        argv, arguments, names = drawn
        args = [*argv, "--socket", str(agent.socket), "--", *arguments]
        res = subprocess.run(
            [XHAGENT, *(os.fsencode(a) for a in args)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        RAN["subprocess"] += 1
        out, err = res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace")
        judge(res.returncode, out, err, names, args[:6])

    case()
    assert "Traceback" not in agent.log.read_text()
