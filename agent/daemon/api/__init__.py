"""The agent's gRPC surface: the unix socket and its transport, the service that turns each
RPC into a call on the scheduler loop or the policy set, and the CLI clients."""
