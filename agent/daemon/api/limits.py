"""The ranges of the API's request fields, shared by the service's checks (request_checks)
and the CLI's options, which refuse what the agent would before sending it. Plain numbers:
the CLI imports this without the service's own modules."""

INT64_MAX = 2**63 - 1  # SQLite's INTEGER: event sequence numbers live there
# pread(2) refuses an offset whose offset + count passes off_t's end: far beyond any log.
MAX_OFFSET = 2**62
MAX_TAIL_LINES = 1_000_000  # logs --tail: the most lines asked for of a stream
MAX_ID = 64  # task ids are 7 characters today; room for them to grow, none for nonsense
MAX_NAME = 253  # policy names and idempotency keys, as the store keeps them
MAX_TEXT = 4096  # file names and reasons: display text
