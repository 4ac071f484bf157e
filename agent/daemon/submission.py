"""What `submit` accepts: Task documents that can run here, every error located."""

from __future__ import annotations

from ..policy.task import Task, parse_task
from ..spec import ErrorList, SpecError, load_text
from .core import InvalidTask
from .leaf import CLASS_WEIGHTS


def parse_submission(source: str, file_name: str) -> list[Task]:
    """The Tasks of `source`; InvalidTask with every FILE:LINE:COL error of it. A task to run
    needs `spec.command`, a class the agent defines, and a name unique in the file."""
    try:
        docs = [d for d in load_text(source, file_name) if d.value is not None]
        if not docs:
            raise SpecError(file_name, 1, 1, "empty: expected one or more Task documents")
        errors, tasks = ErrorList(), []
        for doc in docs:
            with errors.collecting():
                doc.root.mapping(required={"kind"})["kind"].str(["Task"])
                task = parse_task(doc, require_command=True)
                if task.task_class not in CLASS_WEIGHTS:
                    raise doc.error(
                        ("spec", "class"),
                        f"spec.class: {task.task_class!r} is not a class this agent defines "
                        f"({', '.join(sorted(CLASS_WEIGHTS))})",
                    )
                tasks.append(task)
        errors.raise_if_any()
        return tasks
    except SpecError as exc:
        raise InvalidTask(str(exc)) from None
