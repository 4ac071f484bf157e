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
        "stacks_floor": {"slowdown": 1.6},
        "perf_g": {"slowdown": 2.0},
        "offcputime": {"skipped": "offcputime not installed"},
        "xhagent_both_c": {"slowdown": 1.3},
        "perf_g_both_c": {"slowdown": 1.9},
    }
    assert bench._stacks_ratios(out) == {
        "overhead_ratio_xhagent_stacks_to_perf_g": 0.5,
        "overhead_ratio_xhagent_stacks_to_offcputime": None,
        "overhead_ratio_stacks_floor_to_perf_g": 0.6,
        "overhead_ratio_xhagent_both_c_to_perf_g_both_c": 0.3333,
        "overhead_ratio_xhagent_both_c_to_offcputime_c": None,
        "overhead_ratio_stacks_floor_both_c_to_perf_g_both_c": None,  # the floor did not run
        "target_stacks_overhead_at_most_half_of_perf_g": True,
        "stacks_target_above_floor": False,  # the unwinder alone costs over half of perf -g's
    }
    out["perf_g"] = {"slowdown": 1.0}  # no overhead above the noise: undecidable
    ratios = bench._stacks_ratios(out)
    assert ratios["overhead_ratio_xhagent_stacks_to_perf_g"] is None
    assert ratios["target_stacks_overhead_at_most_half_of_perf_g"] is None
    assert ratios["stacks_target_above_floor"] is None


OFFCPUTIME = """\
    bpf_prog_6896d07dd3e1383c_sched_switch
    bpf_trace_run4
    __schedule
    schedule
    anon_pipe_read
    vfs_read
    -                xh-pong (27791)
        13950

    __schedule
    schedule
    anon_pipe_read
    vfs_read
    -                xh-pong (27791)
        50

    __schedule
    schedule
    -                rcu_preempt (15)
        87777

not a block at all
"""


def test_offcputime_summaries_are_read_by_thread_and_kernel_stack():
    got = bench.parse_offcputime(OFFCPUTIME)
    assert got == {
        # the tracing frames dropped, as xhagent's stacks drop them; the same stack summed
        (27791, ("__schedule", "schedule", "anon_pipe_read", "vfs_read")): 14000,
        (15, ("__schedule", "schedule")): 87777,
    }
