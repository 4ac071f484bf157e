"""Room for open files: a command that holds many at once lifts its soft RLIMIT_NOFILE (the
default is often 1024) towards the hard limit, as far as it needs."""

from __future__ import annotations

import resource


def room_for_fds(count: int) -> None:
    """Let this process hold `count` more files than a command's usual few hundred."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        top = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, top), hard))
