"""What `submit` accepts: Task documents that can run here, every error located.

A submission is parsed once, when it comes: each task keeps its own document's text
(`Submitted.document`), so that the store grows with the file and not with its square, and
reading one task again parses that document alone.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ...policy.task import Task, parse_task
from ...spec import ErrorList, SpecError, load_text


class InvalidTask(ValueError):
    """A submission the agent refuses: the message is located (FILE:LINE:COL)."""


@dataclass(frozen=True)
class Submitted:
    task: Task
    document: str  # its own YAML text, cut out of the submitted file


def read_submission(
    source: str, file_name: str, classes: Collection[str] | None = None
) -> list[Submitted]:
    """The Tasks of `source`, each with its document; InvalidTask with every FILE:LINE:COL
    error of it. A task to run needs `spec.command` and, when `classes` is given (a new
    submission; not when a stored one is read again), a class the agent defines."""
    try:
        docs = [d for d in load_text(source, file_name) if d.value is not None]
        if not docs:
            raise SpecError(file_name, 1, 1, "empty: expected one or more Task documents")
        errors, out = ErrorList(), []
        for doc in docs:
            with errors.collecting():
                doc.root.mapping(required={"kind"})["kind"].str(["Task"])
                task = parse_task(doc, require_command=True)
                if classes is not None and task.task_class not in classes:
                    raise doc.error(
                        ("spec", "class"),
                        f"spec.class: {task.task_class!r} is not a class this agent defines "
                        f"({', '.join(sorted(classes))})",
                    )
                out.append(Submitted(task, doc.text))
        errors.raise_if_any()
        return out
    except SpecError as exc:
        raise InvalidTask(str(exc)) from None


def parse_submission(
    source: str, file_name: str, classes: Collection[str] | None = None
) -> list[Task]:
    """The Tasks of `source` alone (see read_submission)."""
    return [s.task for s in read_submission(source, file_name, classes)]
