"""The agent's gRPC contract, `agent.proto` (package `xhagent.v1`), and the modules protoc
generates from it at build time: `agent_pb2` (messages) and `agent_pb2_grpc` (the `Agent`
service's stub and servicer base). `xhagent.daemon.api.transport` binds and connects them."""
