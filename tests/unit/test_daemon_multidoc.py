"""Multi-document submissions: each task keeps its own document, every Pending task says why
it waits, List pages newest first, and every reader applies the same input limits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_daemon_loop import Clock, Loop, node, task

from xhagent.daemon.loop import scheduler as scheduler_module
from xhagent.daemon.loop.scheduler import summary_of
from xhagent.daemon.loop.submission import InvalidTask, read_submission
from xhagent.daemon.store import Store, TaskState
from xhagent.daemon.store.checks import MAX_PAGE_BYTES
from xhagent.spec import MAX_BYTES, MAX_DOCUMENT_BYTES, MAX_DOCUMENTS, SpecError, load_text


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(), Clock())
    yield made
    made.close()


LAYOUTS = [
    "a: 1\nb: [1, 2]\n---\nc: 3\n",
    "# head\n---\n  a: 1\n  b:\n    - x\n    - y\n---\n  c: |\n    lit\n    more\n\n---\n",
    "--- {a: 1, b: 2}\n--- {c: 3}\n",
    "%YAML 1.1\n---\na: 1\n...\n---\nb: >\n  folded\n  text\nc: 12.10\n",
    "- 1\n- 2\n---\n- 3\n",
    "a: 'multi\n  line'\nb: \"x\"   # trailing\n",
    "--- |\n  a scalar document\n--- >-\n  folded\n",
    "a:\n  b: |+\n    kept\n\n\n---\nz: 1\n",
    "a: 1",
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_document_read_alone_is_what_the_file_said(layout):
    docs = [d for d in load_text(layout, "f.yaml") if d.value is not None]
    assert docs
    for doc in docs:
        (alone,) = [d for d in load_text(doc.text, "f.yaml") if d.value is not None]
        assert (alone.value, alone.texts) == (doc.value, doc.texts)


def test_a_submission_stores_each_task_with_its_own_document(loop):
    docs = [task(f"t{i}", command=f"[echo, '{i}']") for i in range(3)]
    ids = loop.submit(*docs)
    for i, task_id in enumerate(ids):
        rec = loop.store.get(task_id)
        assert rec.source == docs[i] and rec.summary.document == 0
        assert rec.first_reason == "Queued"  # waits, and says so, until a step looks at it
    loop.step()
    assert [loop.executor.runs[t].argv[-1] for t in ids] == ["0", "1", "2"]


def test_a_row_an_older_agent_wrote_still_runs_its_own_document(loop):
    # before: every task of a file kept the whole file, and its document's index in it
    docs = [task(f"old{i}", command=f"[echo, '{i}']") for i in range(3)]
    whole = "---\n".join(docs)
    tasks = [s.task for s in read_submission(whole, "old.yaml")]
    rec = loop.store.submit(
        name="old1",
        kind="Task",
        source=whole,
        source_file="old.yaml",
        summary=summary_of(1, tasks[1]),
    )
    loop.step()
    assert loop.state(rec.id) == TaskState.RUNNING
    assert loop.executor.runs[rec.id].argv[-1] == "1"


def test_every_pending_task_starts_or_says_why_past_the_scan_window(loop, monkeypatch):
    monkeypatch.setattr(scheduler_module, "MAX_PENDING_SCAN", 5)
    # each asks for both CPUs of the node: one runs, the rest wait
    ids = loop.submit(*[task(f"w{i}", "  requests: {cpus: 2}\n") for i in range(12)])
    for _ in range(3):
        loop.step()
    recs = [loop.store.get(t) for t in ids]
    assert [r.state for r in recs].count(TaskState.RUNNING) == 1
    waiting = [r for r in recs if r.state == TaskState.PENDING]
    assert len(waiting) == 11 and all(r.reasons for r in waiting)
    kinds = [r.first_reason for r in waiting]
    # the window: the 5 oldest Pending tasks; the rest are not looked at, and say so
    assert kinds[:5] == ["InsufficientCPU"] * 5 and set(kinds[5:]) == {"Queued"}
    # after a restart too: nothing lost its reason
    loop.restart()
    loop.step()
    assert all(loop.store.get(r.id).reasons for r in waiting)


def test_list_pages_newest_first_with_a_token(loop):
    ids = loop.submit(*[task(f"p{i}") for i in range(7)])
    seen, token, pages = [], "", 0
    while True:
        recs, token, total = loop.scheduler.list([], True, 3, token)
        assert total == 7
        seen += [r.id for r in recs]
        pages += 1
        if not token:
            break
    assert seen == ids[::-1] and pages == 3


def test_a_page_cut_by_bytes_is_not_the_last(tmp_path):
    # documents near the per-document limit: MAX_PAGE_BYTES holds fewer than a page's rows
    with Store.open(tmp_path / "state") as store:
        (sub,) = read_submission(task("big"), "big.yaml")
        padded = "#" * (MAX_DOCUMENT_BYTES - 1000) + "\n" + sub.document  # a long comment
        count = MAX_PAGE_BYTES // MAX_DOCUMENT_BYTES + 2
        with store.atomic():
            for i in range(count):
                store.submit(
                    name=f"big{i}",
                    kind="Task",
                    source=padded,
                    source_file="big.yaml",
                    summary=summary_of(0, sub.task),
                )
        page, more = store.task_page([TaskState.PENDING], limit=1000)
        assert more and len(page) < count
        assert len(list(store.each_task([TaskState.PENDING]))) == count


def many(n: int) -> str:
    return "---\n".join(f"{{kind: Task, metadata: {{name: m{i}}}}}\n" for i in range(n))


def test_the_limits_are_located_and_the_same_for_every_reader(tmp_path):
    too_many = many(MAX_DOCUMENTS + 1)
    with pytest.raises(SpecError) as err:
        load_text(too_many, "many.yaml")
    assert str(err.value) == (
        f"many.yaml:{2 * MAX_DOCUMENTS}:1: more than 10,000 documents: split the file"
    )
    with pytest.raises(InvalidTask) as refused:  # the agent's own reading of a submission
        read_submission(too_many, "many.yaml")
    assert str(refused.value) == str(err.value)
    big_doc = "kind: Task\n---\nkind: Task\nx: '" + "y" * MAX_DOCUMENT_BYTES + "'\n"
    with pytest.raises(SpecError, match=r"^big\.yaml:3:1: this document is 1,048,"):
        load_text(big_doc, "big.yaml")
    with pytest.raises(SpecError, match=r"^huge\.yaml:1:1: is 4,194,305 bytes, more than"):
        load_text("#" * MAX_BYTES + "\n", "huge.yaml")
    # the command line: exit 2, the same message, for validate as for submit
    path = tmp_path / "many.yaml"
    path.write_text(too_many)
    got = subprocess.run(
        [Path(sys.executable).parent / "xhagent", "policy", "validate", str(path)],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 2, got.stderr
    assert f"{path}:{2 * MAX_DOCUMENTS}:1: more than 10,000 documents" in got.stderr
    assert "Traceback" not in got.stderr
