"""`xhagent bench trace`'s pure parts: the peers' command lines and the ratios it reports."""

import os

from xhagent.bench import trace as bench


def test_perf_takes_kernel_call_chains_only_when_stacks_are_compared(monkeypatch):
    monkeypatch.setattr(os.path, "isdir", lambda _: True)  # tracefs mounted: no unshare
    plain = bench.perf_command("perf", "d", ["w"])
    assert plain == [
        "perf",
        "record",
        "-m",
        "2048",
        "-e",
        "sched:sched_switch",
        "-a",
        "-o",
        "d",
    ] + [
        "--",
        "w",
    ]
    kernel = bench.perf_command("perf", "d", ["w"], stacks="kernel")
    assert kernel[: kernel.index("-o")][-2:] == ["-g", "--kernel-callchains"]
    both = bench.perf_command("perf", "d", ["w"], stacks="both")
    assert both[: both.index("-o")][-2:] == ["-a", "-g"]


def test_the_stacks_ratios_compare_added_slowdowns():
    out = {
        "xhagent_stacks": {"slowdown": 1.5},
        "perf_g": {"slowdown": 2.0},
        "offcputime": {"skipped": "offcputime not installed"},
    }
    assert bench._stacks_ratios(out) == {
        "overhead_ratio_xhagent_stacks_to_perf_g": 0.5,
        "overhead_ratio_xhagent_stacks_to_offcputime": None,
        "target_stacks_overhead_at_most_half_of_perf_g": True,
    }
    out["perf_g"] = {"slowdown": 1.0}  # no overhead above the noise: undecidable
    ratios = bench._stacks_ratios(out)
    assert ratios["overhead_ratio_xhagent_stacks_to_perf_g"] is None
    assert ratios["target_stacks_overhead_at_most_half_of_perf_g"] is None
