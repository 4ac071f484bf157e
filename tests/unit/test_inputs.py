"""Named inputs: regular files and FIFOs only, read to a stated bound."""

import os
import threading

import pytest

from xhagent.inputs import InputError, open_input, read_input


def test_device_nodes_directories_and_missing_files_are_refused_by_name(tmp_path):
    for path, what in [
        ("/dev/zero", "is a character device, not a regular file"),
        (str(tmp_path), "is a directory, not a regular file"),
        (str(tmp_path / "nope"), "cannot read: No such file or directory"),
    ]:
        with pytest.raises(InputError) as info:
            read_input(path, 100)
        assert str(info.value) == f"{path}: {what}"


def test_a_file_past_the_limit_is_an_error_not_a_truncation(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="is larger than 100 bytes, the limit for policies"):
        read_input(str(f), 100, "policies")
    f.write_bytes(b"x" * 100)
    assert read_input(str(f), 100) == b"x" * 100


def test_a_fifo_is_read_to_its_end(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(b"kind: Task\n"))
    writer.start()
    assert read_input(str(fifo), 1000) == b"kind: Task\n"
    writer.join()


def test_an_endless_fifo_stops_at_the_limit(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    stop = threading.Event()

    def flood():
        try:
            with open(fifo, "wb") as w:
                while not stop.is_set():
                    w.write(b"y" * 65536)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=flood)
    writer.start()
    with pytest.raises(InputError, match="larger than 1,000,000 bytes"):
        read_input(str(fifo), 1_000_000)
    stop.set()
    writer.join()


def test_open_input_returns_a_cloexec_descriptor(tmp_path):
    f = tmp_path / "a"
    f.write_text("a")
    fd = open_input(str(f))
    try:
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
