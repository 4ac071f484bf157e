"""A change broadcast on an event loop, for streams that wait without a thread.

    feed = ChangeFeed(loop)              # on the loop
    feed.bump()                          # any thread: something changed
    change = feed.current()              # on the loop, before reading the state
    ...read...
    await feed.wait(change, timeout)     # returns at once if a bump came after current()

Taking `current()` before the read closes the window between a read that found nothing
and the wait: a change in between has already set the awaited event. Bumps coalesce: one
callback on the loop however many come before it runs.

Every waiter of one change awaits the same future (a done-callback on it and a timer each),
not a task of its own: thousands of idle streams then cost the least the loop allows, and
the fewer small objects they make, the fewer allocator arenas they leave pinned after they
end.
"""

from __future__ import annotations

import asyncio
import threading


class ChangeFeed:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._change: asyncio.Future = loop.create_future()
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
        self._change.set_result(None)
        self._change = self._loop.create_future()

    def current(self) -> asyncio.Future:
        return self._change

    async def wait(self, change: asyncio.Future, timeout: float) -> None:
        """Until `change` happened or `timeout` passed; cancelling a waiter leaves `change`
        to the others (asyncio.wait never cancels what it waits for)."""
        if not change.done():
            await asyncio.wait((change,), timeout=timeout)


__all__ = ["ChangeFeed"]
