"""A change broadcast on an event loop, for streams that wait without a thread.

    feed = ChangeFeed(loop)              # on the loop
    feed.bump()                          # any thread: something changed
    change = feed.current()              # on the loop, before reading the state
    ...read...
    await feed.wait(change, timeout)     # returns at once if a bump came after current()

Taking `current()` before the read closes the window between a read that found nothing
and the wait: a change in between has already set the awaited event. Bumps coalesce: one
callback on the loop however many come before it runs.
"""

from __future__ import annotations

import asyncio
import threading


class ChangeFeed:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._event = asyncio.Event()
        self._pending = False
        self._lock = threading.Lock()

    def bump(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        try:
            self._loop.call_soon_threadsafe(self._fire)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _fire(self) -> None:
        with self._lock:
            self._pending = False
        self._event.set()
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    async def wait(self, change: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(change.wait(), timeout)
        except TimeoutError:
            pass


__all__ = ["ChangeFeed"]
