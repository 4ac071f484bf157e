"""Sampler without io_uring (a kernel or seccomp profile that refuses it): every file by
pread from C, the same bytes; "auto" keeps the ring only when its timed passes beat
pread's; bad arguments refused up front."""

import errno

import pytest

from xhagent.io import sampler as sampler_mod
from xhagent.io.sampler import TRIALS, Sampler


def test_without_a_ring_every_file_is_read_with_pread(tmp_path, monkeypatch):
    def refused(*a, **kw):
        raise OSError(errno.ENOSYS, "io_uring_setup")

    monkeypatch.setattr(sampler_mod, "Ring", refused)
    paths = []
    for i in range(50):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"v %d\n" % i * (i % 5))
        paths.append(str(p))
    with Sampler(paths, via="uring") as s:
        assert s.sample() == {p: open(p, "rb").read() for p in paths}
        assert s.stats["uring"] == 0 and s.stats["pread"] == len(paths)


class _AllInline:
    """A router that sends every file to the ring, whatever the test's mount is."""

    def punted(self, path) -> bool:
        return False


@pytest.mark.parametrize("ring_ns, kept", [(900, False), (100, True)])
def test_auto_keeps_the_way_its_timed_passes_favour(tmp_path, monkeypatch, ring_ns, kept):
    monkeypatch.setattr(sampler_mod, "Router", _AllInline)
    paths = []
    for i in range(40):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"line %d\n" % i * (1 + i % 3))
        paths.append(str(p))
    want = {p: open(p, "rb").read() for p in paths}
    # each timed pass reads the clock twice; the ring's and pread's passes take turns
    ticks = iter([0, ring_ns, 0, 500] * TRIALS + [0, 1, 0, 1])
    monkeypatch.setattr(sampler_mod, "_clock", ticks.__next__)
    with Sampler(paths) as s:
        assert s.sample() == want  # sizes the buffers; every file through the ring
        assert s.stats["uring"] == len(paths) and s.ring_kept is None
        assert s.sample() == want  # the buffers fitted to the files: laid out again
        for _ in range(2 * TRIALS):
            assert s.ring_kept is None
            assert s.sample() == want
        assert s.ring_kept is kept
        assert s.ways == ({"uring": 40, "pread": 0} if kept else {"uring": 0, "pread": 40})
        before = s.stats
        assert s.sample() == want
        got = {k: s.stats[k] - before[k] for k in ("uring", "pread")}
        assert got == ({"uring": len(paths), "pread": 0} if kept else {"uring": 0, "pread": 40})
        extra = tmp_path / "extra"
        extra.write_bytes(b"new\n")
        s.add([extra])  # the set changed: both ways are timed again, from the ring
        assert s.ring_kept is None
        assert s.sample() == {**want, str(extra): b"new\n"}
        assert s.stats["uring"] - before["uring"] == (2 if kept else 1) * len(paths) + 1


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="via must be one of"):
        Sampler([], via="mmap")
    with pytest.raises(ValueError, match="first_read <= max_bytes"):
        Sampler([], first_read=8192, max_bytes=4096)
    with pytest.raises(ValueError, match="null byte"):
        Sampler([str(tmp_path) + "/a\0b"])


def test_a_closed_sampler_refuses_to_sample(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    s = Sampler([tmp_path / "f"])
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.sample()


def test_adding_and_dropping_keeps_paths_indexes_and_bytes_together(tmp_path):
    files = {}
    for name in "abcdef":
        (tmp_path / name).write_bytes(name.encode() * (ord(name) - 96))
        files[name] = str(tmp_path / name)
    with Sampler([files[n] for n in "abc"] + [str(tmp_path / "missing")]) as s:
        assert Sampler([]).sample() == {}
        assert s.sample() == {files[n]: n.encode() * (ord(n) - 96) for n in "abc"}
        s.drop([files["b"], str(tmp_path / "nowhere")])
        s.add([files["d"], files["a"], files["e"]])  # "a" is in the set already
        assert s.paths == (
            files["a"],
            files["c"],
            str(tmp_path / "missing"),
            files["d"],
            files["e"],
        )
        assert s.index(files["d"]) == 3 and str(tmp_path / "missing") in s.errors
        snap = s.sample_packed()
        assert [snap[i] for i in range(len(snap))] == [b"a", b"ccc", None, b"dddd", b"eeeee"]
        assert snap.files_read == 4
        s.drop([str(tmp_path / "missing")])
        assert not s.errors and s.sample() == {files[n]: n.encode() * (ord(n) - 96) for n in "acde"}


def test_a_file_still_growing_when_passes_run_out_is_an_error_not_cut_short(tmp_path, monkeypatch):
    monkeypatch.setattr(sampler_mod, "MAX_PASSES", 1)  # no pass left to read it grown
    (tmp_path / "long").write_bytes(b"l" * 10_000)
    (tmp_path / "short").write_bytes(b"s")
    with Sampler([tmp_path / "long", tmp_path / "short"], first_read=4096) as s:
        assert s.sample() == {str(tmp_path / "short"): b"s"}
        assert s.errors[str(tmp_path / "long")].errno == errno.EAGAIN
        assert s.sample_packed()[0] == b"l" * 10_000  # grown since: whole
