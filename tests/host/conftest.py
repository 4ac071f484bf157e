import os

import pytest


def pytest_collection_modifyitems(config, items):
    # Host tests drive this kernel for real (cgroup writes, BPF, polled I/O): root only.
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="host tests need root (cgroup writes, BPF loading)")
        for item in items:
            if "host" in item.keywords:
                item.add_marker(skip)
