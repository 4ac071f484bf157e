"""Logs' reader of a task's output: the file the shim wrote, nothing put in its place."""

import os
import time

import pytest

from xhagent.daemon.api import output_files
from xhagent.daemon.api.output_files import OutputRefused, read_output, tail_offset


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "stdout").write_bytes(b"0123456789")
    return d


def refused(run_dir, name="stdout") -> str:
    with pytest.raises(OutputRefused) as caught:
        read_output(run_dir, name, 0, 100)
    with pytest.raises(OutputRefused) as tail:  # the tail's reader checks the same
        tail_offset(run_dir, name, 1)
    assert str(tail.value) == str(caught.value)
    return str(caught.value)


def test_the_agents_own_file_is_read_from_an_offset(run_dir):
    assert read_output(run_dir, "stdout", 0, 4) == b"0123"
    assert read_output(run_dir, "stdout", 8, 100) == b"89"
    assert read_output(run_dir, "stdout", 10, 100) == b""


def test_nothing_yet_is_empty(run_dir, tmp_path):
    assert read_output(run_dir, "stderr", 0, 100) == b""
    assert read_output(tmp_path / "not-started", "stdout", 0, 100) == b""


def test_a_symbolic_link_put_in_its_place_is_refused(run_dir, tmp_path):
    (tmp_path / "secret").write_bytes(b"root-only")
    (run_dir / "stdout").unlink()
    (run_dir / "stdout").symlink_to(tmp_path / "secret")
    assert (
        refused(run_dir)
        == f"{run_dir / 'stdout'}: a symbolic link, not the file the agent wrote: not read"
    )


def test_a_hard_link_put_in_its_place_is_refused(run_dir, tmp_path):
    (tmp_path / "secret").write_bytes(b"root-only")
    (run_dir / "stdout").unlink()
    os.link(tmp_path / "secret", run_dir / "stdout")
    assert "a file with 2 names (a hard link)" in refused(run_dir)


def test_a_file_of_another_owner_is_refused(run_dir):
    if os.geteuid() != 0:
        pytest.fail("chown needs root: run the unit tests as root, as `make test` does")
    os.chown(run_dir / "stdout", 65534, 65534)
    assert "owned by uid 65534" in refused(run_dir)


def test_a_fifo_in_its_place_is_refused_at_once(run_dir):
    (run_dir / "stdout").unlink()
    os.mkfifo(run_dir / "stdout")
    started = time.monotonic()
    assert "not a regular file" in refused(run_dir)
    assert time.monotonic() - started < 1


def test_a_run_directory_that_is_a_link_is_refused(run_dir, tmp_path):
    (tmp_path / "link").symlink_to(run_dir)
    assert "the run directory is not a directory" in refused(tmp_path / "link")


@pytest.mark.parametrize(
    "data, lines, tail",
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc", 2, b"b\nc"),  # a last line without its newline is one
        (b"a\nb\nc\n", 3, b"a\nb\nc\n"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),  # fewer lines than asked: all of them
        (b"a\nb\nc\n", 0, b""),
        (b"\n\n\n", 2, b"\n\n"),
        (b"", 5, b""),
        (b"one line, no newline", 1, b"one line, no newline"),
    ],
)
def test_the_tail_begins_where_its_last_lines_do(run_dir, data, lines, tail):
    (run_dir / "stdout").write_bytes(data)
    at = tail_offset(run_dir, "stdout", lines)
    assert data[at:] == tail


def test_a_tail_across_blocks_reads_back_block_by_block(run_dir, monkeypatch):
    monkeypatch.setattr(output_files, "TAIL_BLOCK", 7)  # lines cross the blocks' edges
    data = b"".join(b"line %d\n" % i for i in range(100))
    (run_dir / "stdout").write_bytes(data)
    for lines in (1, 2, 13, 99, 100, 101):
        want = b"".join(b"line %d\n" % i for i in range(max(0, 100 - lines), 100))
        assert data[tail_offset(run_dir, "stdout", lines) :] == want


def test_no_file_yet_has_its_tail_at_0(run_dir, tmp_path):
    assert tail_offset(run_dir, "stderr", 3) == 0
    assert tail_offset(tmp_path / "not-started", "stdout", 3) == 0


S = output_files.SECOND


@pytest.mark.parametrize(
    "since,start",
    [
        (0, 0),  # before the first mark: everything
        (10 * S + 100, 0),  # in the first mark's second, after it: that second's output too
        (10 * S + S // 2, 0),
        (11 * S, 5),  # the second after: what came in mark 0's second is left out
        (12 * S + 3, 5),  # no mark in between: the next one
        (13 * S, 5),  # exactly the second mark's second
        (13 * S + 700, 5),
        (14 * S, 9),  # after the last mark's second: its bytes came before since
        (99 * S, 9),
    ],
)
def test_since_starts_at_the_first_second_of_output_at_or_after_it(since, start):
    marks = [(10 * S + 100, 0), (13 * S + 600, 5)]
    assert output_files.offset_since(marks, 9, since) == start


def test_since_reads_the_shims_marks_with_the_outputs_own_checks(run_dir):
    assert output_files.since_offset(run_dir, "stdout", 0) == 0  # no index: from the start
    marks = output_files.MARK.pack(5 * S, 0) + output_files.MARK.pack(8 * S, 4)
    (run_dir / "stdout.times").write_bytes(marks + b"torn")  # a torn last mark is no mark
    assert output_files.since_offset(run_dir, "stdout", 6 * S) == 4
    assert output_files.since_offset(run_dir, "stdout", 9 * S) == 10  # the end: nothing since
    assert output_files.since_offset(run_dir, "stderr", 9 * S) == 0  # no stream yet
    os.unlink(run_dir / "stdout.times")
    os.symlink("/etc/passwd", run_dir / "stdout.times")
    with pytest.raises(OutputRefused, match="symbolic link"):
        output_files.since_offset(run_dir, "stdout", 6 * S)
