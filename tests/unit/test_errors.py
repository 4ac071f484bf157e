"""One wording for kernel errors: every OSError subclass of the agent derives from KernelError."""

import errno

import pytest

from xhagent.bpf.loader import BpfError
from xhagent.cgroups import CgroupError, SpawnError
from xhagent.errors import KernelError
from xhagent.io import UringError


@pytest.mark.parametrize("cls", [CgroupError, SpawnError, UringError, BpfError])
def test_each_subclass_words_its_message_one_way(cls):
    assert issubclass(cls, KernelError) and issubclass(cls, OSError)
    exc = cls.from_errno(-errno.EOPNOTSUPP, "read /dev/nvme0n1")
    assert exc.errno == errno.EOPNOTSUPP and exc.filename == "read /dev/nvme0n1"
    assert str(exc) == "read /dev/nvme0n1: -EOPNOTSUPP (Operation not supported)"
    assert str(cls.from_errno(errno.EBADF, "x")) == "x: -EBADF (Bad file descriptor)"


def test_a_message_alone_has_no_errno_prefix():
    exc = CgroupError(errno.EBUSY, "rmdir /sys/fs/cgroup/a: Device or resource busy")
    assert str(exc) == "rmdir /sys/fs/cgroup/a: Device or resource busy"
    assert "Errno" not in str(exc)
    assert str(KernelError("bare")) == "bare"  # no errno given: what OSError says
