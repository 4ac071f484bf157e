"""read_files' routing, pure: the mount table's deepest prefix names a path's mount, the
kernel is asked once per mount, and an answerless probe is asked again."""

from xhagent import mountinfo
from xhagent.io.nowait import Router

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
24 22 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
25 24 0:23 / /sys/fs/cgroup rw,nosuid shared:8 - cgroup2 cgroup2 rw,nsdelegate
26 22 0:24 / /mnt/my\\040disk rw - xfs /dev/sdb rw,noquota
"""


def test_mountinfo_types_points_and_options():
    mounts = mountinfo.parse(MOUNTINFO + "garbage line without separator\n")
    assert [(m.path, m.fstype) for m in mounts] == [
        ("/", "ext4"),
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/sys/fs/cgroup", "cgroup2"),
        ("/mnt/my disk", "xfs"),
    ]
    assert mounts[3].options == ("rw", "nosuid", "nsdelegate")


class Probe:
    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def __call__(self, path):
        self.asked.append(path)
        return self.answers(path)


def test_deepest_mount_point_wins_and_each_mount_is_asked_once():
    probe = Probe(lambda p: p.startswith(("/proc", "/sys")))
    router = Router(mountinfo.parse(MOUNTINFO), probe)
    assert router.mount_point("/sys/fs/cgroup/a.slice/cpu.stat") == "/sys/fs/cgroup"
    assert router.mount_point("/sys/kernel/mm") == "/sys"
    assert router.mount_point("/mnt/my disk/f") == "/mnt/my disk"
    assert router.mount_point("/sysfoo/x") == "/"  # a prefix of the name is not a parent
    paths = [
        "/proc/1/stat",
        "/proc/2/stat",
        "/sys/fs/cgroup/cpu.stat",
        "/sys/fs/cgroup/x/io.stat",
        "/home/u/f",
        "/etc/hostname",
        "/proc/self/status",
    ]
    assert [router.punted(p) for p in paths] == [True, True, True, True, False, False, True]
    assert probe.asked == ["/proc/1/stat", "/sys/fs/cgroup/cpu.stat", "/home/u/f"]
    assert router.answers() == {"/proc": True, "/sys/fs/cgroup": True, "/": False}


def test_relative_paths_and_unknown_mounts_go_through_io_uring_unasked():
    probe = Probe(lambda p: True)
    router = Router([mountinfo.MountEntry("/proc", "proc")], probe)
    assert not router.punted("stat") and not router.punted("rel/dir/stat")
    assert not router.punted("/etc/hostname")  # no mount on / in this table
    assert probe.asked == []


def test_a_probe_without_an_answer_is_repeated_with_the_next_path():
    probe = Probe(lambda p: None if p.endswith("missing") else True)
    router = Router(mountinfo.parse(MOUNTINFO), probe)
    assert router.punted("/proc/missing") is False
    assert router.punted("/proc/1/stat") is True and router.punted("/proc/2/stat") is True
    assert probe.asked == ["/proc/missing", "/proc/1/stat"]
