"""Every registered subcommand imports and shows its help."""

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
