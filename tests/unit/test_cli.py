"""Every registered subcommand imports and shows its help."""

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from xhagent import cli


@pytest.mark.parametrize("group,table", [(cli.main, cli.COMMANDS), (cli.bench, cli.BENCHMARKS)])
def test_registered_commands_resolve(group, table):
    ctx = click.Context(group)
    for name in table:
        assert isinstance(group.get_command(ctx, name), click.Command), name


def test_help_lists_every_command():
    res = CliRunner().invoke(cli.main, ["--help"])
    assert res.exit_code == 0, res.output
    for name in [*cli.COMMANDS, "doctor"]:
        assert f"  {name} " in res.output


def test_version_names_the_build():
    import json

    from xhagent import __version__

    res = CliRunner().invoke(cli.main, ["version", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["version"] == __version__
    assert info["native"] == {"uring": True, "bpf": True, "spawn": True}
    assert "sched_trace.bpf.o" in info["bpf_objects"]
    assert CliRunner().invoke(cli.main, ["version"]).output.startswith(f"xhagent {__version__}\n")


def test_shell_completion_reaches_lazy_subcommands():
    # The README's completion line: bash asks the program itself for candidates.
    res = CliRunner().invoke(
        cli.main,
        [],
        prog_name="xhagent",
        env={
            "_XHAGENT_COMPLETE": "bash_complete",
            "COMP_WORDS": "xhagent cgroup fr",
            "COMP_CWORD": "2",
        },
    )
    assert res.output.split() == ["plain,freeze"]


def complete(words: str) -> list[str]:
    env = {"_XHAGENT_COMPLETE": "bash_complete", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    return CliRunner().invoke(cli.main, [], prog_name="xhagent", env=env).output.split()


def test_doctor_require_completes_item_names_without_probing(monkeypatch):
    def probed(*_a, **_kw):
        raise AssertionError("completion ran a probe")

    monkeypatch.setattr("xhagent.doctor.run_probes", probed)
    assert complete("xhagent doctor --require cgroup.") == [
        f"plain,cgroup.{n}"
        for n in ("mode", "v2", "controllers", "create", "spawn", "freeze", "kill")
    ]
    assert complete("xhagent doctor --require io_uring.o") == [
        "plain,io_uring.o_direct",
        "plain,io_uring.ops",
    ]
    assert complete("xhagent doctor --require nosuch") == []


def test_item_names_add_a_polled_read_item_per_block_device(tmp_path):
    from xhagent.doctor import ITEMS, item_names

    for name, size in (("loop0", 0), ("nvme0n1", 131072), ("vda", 1 << 29)):
        d = tmp_path / "block" / name / "queue"
        d.mkdir(parents=True)
        (d.parent / "dev").write_text("259:0\n")
        (d.parent / "size").write_text(f"{size}\n")
        (d / "io_poll").write_text("0\n")
        (d / "logical_block_size").write_text("512\n")
    names = item_names(tmp_path)
    at = names.index("iopoll")
    assert names[at : at + 4] == ["iopoll", "iopoll.nvme0n1", "iopoll.vda", "iopoll.file"]
    assert [n for n in names if not n.startswith("iopoll.") or n == "iopoll.file"] == list(ITEMS)
    assert item_names(tmp_path / "nowhere") == list(ITEMS)


def test_the_doctor_items_are_the_documented_ones():
    from xhagent.doctor import ITEMS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = doc.split("## The doctor", 1)[1].split("\n\n**", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_.<>]+)` \|", table, re.M)
    assert [r for r in rows if r != "iopoll.<dev>"] == list(ITEMS)


@pytest.mark.parametrize("raised,code", [(KeyboardInterrupt, 130), ("SIGTERM", 143)])
def test_a_stop_by_signal_is_one_line_and_128_plus_n(monkeypatch, raised, code):
    import signal

    from xhagent.signals import Terminated

    def stopped(*_args, **_kwargs):
        raise raised() if raised is KeyboardInterrupt else Terminated(signal.SIGTERM)

    monkeypatch.setattr("xhagent.doctor.run_probes", stopped)
    res = CliRunner().invoke(cli.main, ["doctor"])
    assert res.exit_code == code, res.output
    assert res.output == f"xhagent: stopped by {signal.Signals(code - 128).name}\n"


def test_logs_since_takes_a_duration_back_from_now_or_an_rfc3339_time():
    import time

    from xhagent.daemon.api.cli import Since

    since = Since()
    before = time.time_ns()
    back = since.convert("1h30m", None, None)
    assert before - 5400 * 10**9 <= back <= time.time_ns() - 5400 * 10**9
    assert since.convert("2026-12-04T18:00:00.5Z", None, None) == 1796407200_500000000
    assert since.convert("2026-12-04T19:00:00+01:00", None, None) == 1796407200_000000000
    assert since.convert("1000000h", None, None) == 0  # before the epoch: from the start
    for bad in ("yesterday", "5 minutes", "2026-12-04", "-5m"):
        with pytest.raises(click.BadParameter, match="neither a duration"):
            since.convert(bad, None, None)
