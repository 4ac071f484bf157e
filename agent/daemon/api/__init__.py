"""The agent's gRPC surface: the unix socket and its transport (server side) and client, the
service that turns each RPC into a call on the scheduler loop or the policy set, and the CLI
clients."""

import os

# The daemon forks (task starts, helpers) while grpc's threads run; grpc's fork handlers
# cannot help a server then, and log a line for every fork. grpc reads this once, when it
# loads: here, before any module of this package (client, transport, v1) imports it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
