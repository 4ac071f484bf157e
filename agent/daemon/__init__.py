"""The agent daemon (`xhagent run`), in rooms by role: `store/` (durable state), `exec/`
(leaves and shims), `loop/` (the scheduler loop and each task's lifecycle), `policies/` (the
policies in force), `api/` (the gRPC surface and its CLI clients); `daemon.py` wires them.
docs/architecture.md has the floor plan and its rules."""
