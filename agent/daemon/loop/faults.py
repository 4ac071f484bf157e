"""The agent's own failures, kept apart from its users': an internal error of one of its
loops (a scheduler step that raised, a policy reload that broke) is counted by where it
happened, logged once when it starts and once when it clears (with how many times it
happened meanwhile), and makes Health answer not-serving with the reason while it persists.
An internal error of one API call (`counted`) is a call's, not a loop's: counted and logged
(its traceback once per message), with nothing left open.

A user's error (a bad document, a workload that cannot start, a refused request) never
comes here: it is the task's or the request's outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

# Where internal errors are counted: every one exists from the start (a counter at 0).
WHERES = ("scheduler_step", "policy_reload", "api")
MAX_SEEN = 100  # distinct messages of counted errors whose traceback was logged

log = logging.getLogger("xhagent")


@dataclass
class _Open:
    message: str  # the first error's, one line
    since: float  # wall-clock time of the first
    count: int = 1


class Faults:
    def __init__(self, wheres: tuple[str, ...] = WHERES):
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(wheres, 0)
        self._open: dict[str, _Open] = {}
        self._seen: set[tuple[str, str]] = set()

    def failed(self, where: str, exc: BaseException) -> None:
        """An internal error at `where`: logged with its traceback only when it is the first
        since `where` last worked."""
        message = _one_line(exc)
        with self._lock:
            self._totals[where] = self._totals.get(where, 0) + 1
            current = self._open.get(where)
            if current is not None:
                current.count += 1
                return
            self._open[where] = _Open(message, time.time())
        log.error("internal error in %s: %s", where, message, exc_info=exc)

    def counted(self, where: str, exc: BaseException, call: str = "") -> None:
        """An internal error of one `call` at `where` (an API method): counted; logged with
        its traceback the first time its message is seen, in one line after that."""
        key = (where, f"{call}: {_one_line(exc)}" if call else _one_line(exc))
        with self._lock:
            self._totals[where] = self._totals.get(where, 0) + 1
            first = key not in self._seen and len(self._seen) < MAX_SEEN
            if first:
                self._seen.add(key)
        log.error("internal error in %s: %s", where, key[1], exc_info=exc if first else None)

    def cleared(self, where: str) -> None:
        """`where` worked again."""
        with self._lock:
            current = self._open.pop(where, None)
        if current is not None:
            log.warning(
                "%s works again after %d internal error(s) in %.1fs (the first: %s)",
                where,
                current.count,
                time.time() - current.since,
                current.message,
            )

    def health(self) -> str | None:
        """None when nothing fails now; else one line per place that does."""
        with self._lock:
            if not self._open:
                return None
            return "; ".join(
                f"{where}: {o.message} ({o.count} time(s) since "
                f"{time.strftime('%H:%M:%S', time.localtime(o.since))})"
                for where, o in sorted(self._open.items())
            )

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._totals)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
