"""Which allocator `xhagent run` executes itself with: the choice is pure (the environment
is its input); the exec is proven by a real agent (tests/host/test_daemon_allocator_host.py)."""

import pytest

from xhagent.daemon.allocator import MARK, Choice, choose


def test_malloc_is_an_exec_with_pythonmalloc_set_and_marked_so_it_happens_once():
    choice = choose("malloc", {"PATH": "/bin"})
    assert choice.name == "malloc" and choice.env == {"PYTHONMALLOC": "malloc", MARK: "malloc"}
    again = choose("malloc", {**choice.env, "PATH": "/bin"})
    assert again == Choice("malloc", "chosen at start") and again.env is None


def test_pymalloc_asked_for_is_no_exec_and_says_what_it_costs():
    choice = choose("pymalloc", {})
    assert choice.env is None and choice.why == (
        "--allocator pymalloc: freed memory can stay resident"
    )


def test_a_callers_own_pythonmalloc_is_left_as_it_is():
    choice = choose("malloc", {"PYTHONMALLOC": "debug"})
    assert choice.env is None and choice.name == "as set"
    assert choice.why == "PYTHONMALLOC=debug set by the caller, left as it is"


def test_an_unknown_allocator_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^--allocator 'jemalloc': one of malloc, pymalloc$"):
        choose("jemalloc", {})


def test_an_exec_that_fails_leaves_the_agent_as_it_is_and_says_so(monkeypatch):
    import signal

    from xhagent.daemon import allocator

    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.delenv(MARK, raising=False)
    monkeypatch.setattr(allocator.sys, "executable", "/nonexistent/python3")
    said = allocator.settle("malloc")
    assert said == (
        "pymalloc (executing /nonexistent/python3 again failed: No such file or directory)"
    )
    assert not set(allocator.HELD_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, ())
