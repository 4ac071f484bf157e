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
