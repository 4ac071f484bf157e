"""Numbers that bound time or size: NaN, infinities and out-of-range values are refused."""

import click
import pytest
from click.testing import CliRunner

from xhagent.bench.io import bench_io
from xhagent.cliparams import FiniteFloat


@click.command()
@click.option("--seconds", type=FiniteFloat(0, 600))
@click.option("--ratio", type=FiniteFloat(0, 1, lo_open=False))
def probe(seconds, ratio):
    click.echo(f"{seconds} {ratio}")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seconds", "nan"], "nan is not a finite number"),
        (["--seconds", "-inf"], "-inf is not a finite number"),
        (["--seconds", "0"], "0 is out of range: must be > 0 and <= 600"),
        (["--seconds", "601"], "601 is out of range"),
        (["--seconds", "soon"], "'soon' is not a number"),
        (["--ratio", "-0.1"], "must be >= 0 and <= 1"),
    ],
)
def test_refused_with_exit_2(args, message):
    res = CliRunner().invoke(probe, args)
    assert res.exit_code == 2 and message in res.output, res.output


def test_accepted_values_pass_through():
    res = CliRunner().invoke(probe, ["--seconds", "2.5", "--ratio", "0"])
    assert res.exit_code == 0 and res.output == "2.5 0.0\n"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seconds", "nan"], "nan is not a finite number"),
        (["--file", "/dev/zero"], "/dev/zero: not a regular file or a block device"),
        (["--file", "/nonexistent/x"], "/nonexistent/x: No such file or directory"),
        (["--size", "1000000000G"], "free in"),
    ],
)
def test_bench_io_refuses_before_running(args, message):
    res = CliRunner().invoke(bench_io, args)
    assert res.exit_code == 2 and message in res.output, res.output


def test_bench_io_refuses_a_file_too_small_to_sample(tmp_path):
    small = tmp_path / "small"
    small.write_bytes(b"x" * 4096)
    res = CliRunner().invoke(bench_io, ["--file", str(small)])
    assert res.exit_code == 2 and "4096 bytes; the file must hold at least 1 MiB" in res.output
