"""Small filesystems for the host tests of a full disk: a tmpfs the test mounts (and
unmounts), and files of the test's own that use up what is left of it."""

import errno
import subprocess
from contextlib import contextmanager


@contextmanager
def small_tmpfs(mnt, options: str):
    """A tmpfs at `mnt` (made here) with mount `options` such as "size=1m"."""
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def use_up_blocks(path) -> None:
    """Zeros into `path` until the filesystem says ENOSPC."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
