"""Every benchmark (`xhagent bench NAME`, see `BENCHMARKS` in xhagent.cli) and what drives
them, such as `local_agent.LocalAgent`, the scratch `xhagent run` child: one room for them all.

The top floor: a module here may import any package of the agent, and no library package
imports one of these (only the root CLI, lazily, and the tests; `tests/unit/test_imports.py`
checks it). Logic a library needs stays in that library, and the benchmark imports it.
"""
