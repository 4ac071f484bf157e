"""The API's access rules (api/access.py), pure: who is an admin, whom a user's task runs
as, what a user may see. The real users and socket are tests/host/test_daemon_access_host.py."""

import os
import pwd

import pytest

from xhagent.daemon.api.access import Access, Directory, PermissionDenied
from xhagent.daemon.api.peers import Caller

NOBODY = pwd.getpwnam("nobody")


def user(uid=NOBODY.pw_uid, gid=NOBODY.pw_gid, groups=()) -> Access:
    return Access(Caller(uid, gid, 4242), admin=False, groups=frozenset({gid, *groups}))


def test_root_is_an_admin_and_a_user_is_not():
    directory = Directory(admin_group=None)
    assert directory.access(Caller(0, 0, 1)).admin
    assert directory.access(Caller(os.geteuid(), 0, 1)).admin  # the agent's own user
    assert not directory.access(Caller(NOBODY.pw_uid, NOBODY.pw_gid, 1)).admin


def test_the_admin_group_makes_admins_by_the_gid_a_caller_connected_with():
    group = pwd.getpwuid(0).pw_gid  # root's group: one that exists here
    import grp

    name = grp.getgrgid(group).gr_name
    assert Directory(admin_group=name).access(Caller(NOBODY.pw_uid, group, 1)).admin
    assert (
        not Directory(admin_group="no-such-group-here")
        .access(Caller(NOBODY.pw_uid, group, 1))
        .admin
    )


def test_a_users_task_without_user_runs_as_the_caller_with_its_gid():
    assert user().run_as(None, None, "t") == (NOBODY.pw_uid, NOBODY.pw_gid)


def test_a_user_may_name_itself_by_name_or_uid():
    assert user().run_as("nobody", None, "t") == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert user().run_as(NOBODY.pw_uid, None, "t") == (NOBODY.pw_uid, NOBODY.pw_gid)


@pytest.mark.parametrize("other", ["root", 0, "no-such-user-here", 123456])
def test_a_user_may_not_run_a_task_as_another(other):
    with pytest.raises(PermissionDenied) as err:
        user().run_as(other, None, "t")
    assert f"user {other}: uid {NOBODY.pw_uid} (pid 4242) may submit only" in str(err.value)


def test_a_user_may_run_a_task_in_its_own_groups_only():
    assert user(groups=(4000,)).run_as(None, 4000, "t") == (NOBODY.pw_uid, 4000)
    with pytest.raises(PermissionDenied, match="is not a member of it"):
        user().run_as(None, 0, "t")
    with pytest.raises(PermissionDenied, match="group root"):
        user().run_as(None, "root", "t")


def test_an_admins_task_runs_as_its_document_says():
    admin = Access(Caller(0, 0, 1), admin=True, groups=frozenset({0}))
    assert admin.run_as("nobody", None, "t") is None and admin.run_as(None, None, "t") is None


def test_a_user_owns_its_tasks_and_no_others():
    me = user()
    assert me.owns(NOBODY.pw_uid)
    assert not me.owns(0) and not me.owns(None)  # None: the agent's, from before owners
    with pytest.raises(PermissionDenied, match="for admins only"):
        me.require_admin("apply policies")


def test_group_lookups_are_cached_then_asked_again():
    now = [0.0]
    directory = Directory(admin_group=None, clock=lambda: now[0])
    first = directory.access(Caller(NOBODY.pw_uid, NOBODY.pw_gid, 1)).groups
    assert NOBODY.pw_gid in first
    now[0] = 61.0
    assert directory.access(Caller(NOBODY.pw_uid, 99999, 1)).groups == first | {99999}


# -- the change feed a following stream waits on (api/feed.py) --------------------------------
def test_a_change_between_the_read_and_the_wait_is_not_missed():
    import asyncio
    import threading
    import time

    from xhagent.daemon.api.feed import ChangeFeed

    async def main():
        feed = ChangeFeed(asyncio.get_running_loop())
        change = feed.current()
        thread = threading.Thread(target=feed.bump)  # as the scheduler loop's thread does
        thread.start()
        thread.join()
        started = time.monotonic()
        await feed.wait(change, 5.0)
        woke = time.monotonic() - started
        quiet = feed.current()
        started = time.monotonic()
        await feed.wait(quiet, 0.2)
        return woke, time.monotonic() - started

    woke, quiet = asyncio.run(main())
    assert woke < 1.0  # the bump came before the wait began, and still woke it
    assert quiet >= 0.19  # nothing changed: the wait ran to its timeout


def test_a_stream_that_ends_while_waiting_leaves_the_change_to_the_others():
    import asyncio

    from xhagent.daemon.api.feed import ChangeFeed

    async def main():
        feed = ChangeFeed(asyncio.get_running_loop())
        change = feed.current()
        gone = asyncio.create_task(feed.wait(change, 30.0))
        staying = asyncio.create_task(feed.wait(change, 30.0))
        await asyncio.sleep(0.05)
        gone.cancel()  # a client cancelled its Watch
        await asyncio.sleep(0.05)
        feed.bump()
        await asyncio.wait_for(staying, 5.0)  # still woken by the change
        return gone.cancelled(), change.cancelled()

    assert asyncio.run(main()) == (True, False)
