"""Fixtures shared by the host, kernel and gpu tests."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

XHAGENT = Path(sys.executable).with_name("xhagent")


def xhagent(*args, timeout=120):
    """Run the installed `xhagent` CLI; a CompletedProcess with text output."""
    return subprocess.run([str(XHAGENT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def run_xhagent():
    return xhagent


@pytest.fixture(scope="module")
def doctor_report():
    """`xhagent doctor --json` run once per module, as its items."""
    res = xhagent("doctor", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["items"]
