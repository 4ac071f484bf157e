"""`xhagent bench pool --quick --json`: one real run (worker processes, asyncio and the
process-pool baselines), and what its report promises: every ratio the issue names, each a
number or null with the reason beside it, its target, and a verdict consistent with both."""

import json
import math
import subprocess
import sys
from pathlib import Path

from xhagent.bench.pool import TARGETS

OURS = (
    "spawn_vs_asyncio",
    "switch_vs_asyncio",
    "submit_vs_processpool",
    "map_vs_mp_pool",
    "imbalanced_vs_balanced",
)

OUR_CASES = (
    "spawn_join",
    "spawn_join_asyncio",
    "switch",
    "switch_asyncio",
    "switch_1_task",
    "switch_1_task_asyncio",
    "switch_greenlet_floor",
    "switch_plain",
    "switch_plain_asyncio",
    "submit",
    "submit_owner",
    "submit_processpool",
    "map",
    "map_mp_pool",
    "steal_balanced",
    "steal_imbalanced",
    "scaling_1_worker",
    "scaling_2_workers",
)


def test_quick_run_reports_every_ratio_with_its_target_and_verdict():
    exe = Path(sys.executable).with_name("xhagent")
    res = subprocess.run(
        [str(exe), "bench", "pool", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    ratios, targets, met = report["ratios"], report["targets"], report["targets_met"]
    assert set(ratios) == set(TARGETS)
    for name, (op, value) in TARGETS.items():
        assert targets[name] == {"op": op, "value": value}
        got = ratios[name]
        if got is None:
            assert report["details"][name], f"{name} is null without a reason"
            assert met[name] is None
        else:
            # a loss is measured against noise and may come out below 0; the others are
            # ratios of two positive rates or times
            assert math.isfinite(got) and (got > 0 or name.endswith("_loss"))
            assert met[name] is (got >= value if op == ">=" else got <= value)
    for name in OURS:  # measured here, whatever the machine
        assert isinstance(ratios[name], float), name
    for name in OUR_CASES:  # the merged modules' cases are theirs to check
        case = report["cases"][name]
        assert case["ops_per_s"] > 0 and 0 < case["p50_us"] <= case["p99_us"], name
    assert report["details"]["submit"]["submitter"].startswith("another process")
    mem = report["memory"]
    assert mem["rss_per_idle_worker_bytes"] > 0 and mem["bytes_per_parked_context"] > 0
    assert isinstance(mem["contexts_made_during_run"], int) and mem["run_tasks"] > 0
    assert met["contexts_made_during_run"] is (mem["contexts_made_during_run"] == 0)
