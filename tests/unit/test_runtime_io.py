"""runtime.io without a usable io_uring: the call that needs the ring fails with the reason
(the errno kept, the sysctl named), and the scheduler is left without a half-made ring."""

import errno

import pytest

from xhagent.io.ring import UringError
from xhagent.runtime import api as rt
from xhagent.runtime import io as rio


@pytest.mark.parametrize(
    ("code", "disabled", "words"),
    [
        (errno.ENOSYS, "0", "this kernel has no io_uring"),
        (errno.EPERM, "2", "kernel.io_uring_disabled = 2"),
    ],
)
def test_no_io_uring_is_a_clear_error_at_the_call(monkeypatch, code, disabled, words):
    def refused(*args, **kwargs):
        raise UringError.from_res(-code, "io_uring_setup(1024, ())")

    monkeypatch.setattr(rio, "Ring", refused)
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda p, *a, **k: (
            __import__("io").StringIO(disabled + "\n")
            if p == "/proc/sys/kernel/io_uring_disabled"
            else real_open(p, *a, **k)
        ),
    )

    def main():
        with pytest.raises(rio.IoUnavailable) as info:
            rt.read(0, 10, 0)
        return info.value, rt._core._running._io

    err, ring = rt.run(main)
    assert isinstance(err, OSError) and err.errno == code
    assert words in str(err) and errno.errorcode[code] in str(err)
    assert ring is None
