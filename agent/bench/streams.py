"""`xhagent bench streams`: what idle following streams cost a scratch agent.

One run starts an `xhagent run` child and reports, as JSON:

- `baseline`: unary calls (Health, List) from one client, p50/p99, and the agent's RSS and
  thread count, with no stream open;
- `open`: the same with `--streams` idle `Watch(follow=true)` streams open (each has read
  its first event, so each is established in the agent), and how long opening took;
- `closed`: the agent's RSS `--settle-seconds` after the streams were closed;
- `p99_ratio`: p99 with the streams open / without (the peer here is the agent itself
  with none open: what a user would have instead);
- `targets_met`: p99 with streams open < 50 ms; RSS after close within 10 MB of baseline.

The scratch agent's per-caller stream bound is raised to hold them all (they come from
one uid); the bound's own refusal is a host test.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from ..cliparams import FiniteFloat

TARGETS = {"open_p99_ms": 50.0, "rss_back_within_mb": 10.0}
BASELINE_SETTLE_S = 5.0


def _rss_threads(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def _unary(client, calls: int) -> dict:
    from ..daemon.api.v1 import agent_pb2 as pb

    took = []
    for i in range(calls):
        started = time.perf_counter()
        if i % 2:
            client.List(pb.ListRequest(all=True, limit=10))
        else:
            client.Health(pb.HealthRequest())
        took.append(time.perf_counter() - started)
    took.sort()
    return {
        "calls": calls,
        "p50_ms": round(took[len(took) // 2] * 1e3, 3),
        "p99_ms": round(took[min(len(took) - 1, int(0.99 * len(took)))] * 1e3, 3),
    }


def _allocator(client) -> str:
    """What the agent said it runs with (its Allocator event)."""
    from ..daemon.api.v1 import agent_pb2 as pb

    for event in client.Watch(pb.WatchRequest(since_seq=0, follow=False)):
        if event.kind == "Allocator":
            return event.message
    return "not said"


def _state(agent, client, calls: int) -> dict:
    rss, threads = _rss_threads(agent.proc.pid)
    return {**_unary(client, calls), "rss_mb": round(rss, 1), "threads": threads}


@click.command("streams")
@click.option(
    "--streams",
    default=2000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Idle Watch streams to open, 1..100000.",
)
@click.option(
    "--calls",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Unary calls timed per phase, 1..1000000.",
)
@click.option(
    "--settle-seconds",
    default=60.0,
    show_default=True,
    type=FiniteFloat(0, 600, unit=" s"),
    help="How long after the streams close the agent's RSS is read.",
)
@click.option(
    "--allocator",
    type=click.Choice(["malloc", "pymalloc"]),
    default="malloc",
    show_default=True,
    help="The scratch agent's allocator (xhagent run --allocator).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (what this bench prints anyway).")
def bench_streams(streams, calls, settle_seconds, allocator, as_json):
    """Unary latency and the agent's memory with N idle following streams, and after."""
    from ..daemon.api.client import connect
    from ..daemon.api.v1 import agent_pb2 as pb
    from .local_agent import LocalAgent

    if os.geteuid() != 0:
        click.echo("xhagent bench streams: needs root (a scratch agent)", err=True)
        sys.exit(1)
    base = Path(tempfile.mkdtemp(prefix="xhagent-bench-streams-"))
    agent = LocalAgent(
        base,
        f"xhagent-bench-streams-{os.getpid()}.slice",
        policies=False,
        extra=("--max-streams", str(streams + 16), "--allocator", allocator),
    )
    out: dict = {"benchmark": "streams", "cpus": os.cpu_count(), "streams": streams}

    def progress(msg: str) -> None:
        click.echo(f"bench streams: {msg}", err=True)

    try:
        progress("starting a scratch agent")
        agent.start()
        with agent.client() as client:
            client.Health(pb.HealthRequest())
            out["allocator"] = _allocator(client)
            # what start-up freed is given back by then, on any allocator
            time.sleep(BASELINE_SETTLE_S)
            out["baseline"] = _state(agent, client, calls)
            progress(f"opening {streams} idle Watch streams")
            watcher = connect(agent.socket, timeout=None)
            started = time.monotonic()
            held = []
            for _ in range(streams):
                stream = watcher.Watch(pb.WatchRequest(since_seq=0, follow=True))
                next(stream)  # established in the agent: it sent the first event
                held.append(stream)
            opened_s = time.monotonic() - started
            time.sleep(1.0)
            out["open"] = {"opened_s": round(opened_s, 2), **_state(agent, client, calls)}
            progress("closing them")
            for stream in held:
                stream.close()
            watcher.close()
            del held
            progress(f"{settle_seconds:g} s for the agent to give memory back")
            time.sleep(settle_seconds)
            out["closed"] = {"settled_s": settle_seconds, **_state(agent, client, calls)}
    except Exception as exc:
        click.echo(f"xhagent bench streams: {exc}\n{agent.tail()}", err=True)
        sys.exit(1)
    finally:
        agent.stop()
        agent.remove_subtree()
        shutil.rmtree(base, ignore_errors=True)
    out["p99_ratio"] = round(out["open"]["p99_ms"] / max(out["baseline"]["p99_ms"], 1e-3), 2)
    out["targets"] = TARGETS
    out["targets_met"] = {
        "open_p99_ms": out["open"]["p99_ms"] < TARGETS["open_p99_ms"],
        "rss_back_within_mb": out["closed"]["rss_mb"] - out["baseline"]["rss_mb"]
        <= TARGETS["rss_back_within_mb"],
    }
    click.echo(json.dumps(out, indent=2))
