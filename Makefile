# Two entry points: `make run` and `make test`. Both set everything up first
# (Debian packages, .venv, native parts, guest kernel) and skip what is already there.
SHELL := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMPS := .cache/stamps

NATIVE_SOURCES := pyproject.toml setup.py $(wildcard native/*.py native/*.c native/*.h ebpf/*.bpf.c ebpf/*.h ebpf/build.py agent/daemon/api/v1/*.proto)

.PHONY: run test setup deps guest-kernel viewer test-host test-kernel package clean

# The agent in the foreground, state under .cache/; Ctrl-C stops it (workloads keep running).
run: setup
	$(BIN)/xhagent run --state-dir .cache/agent-state

test: setup
	@rc=0; \
	$(BIN)/ruff check . && $(BIN)/ruff format --check . || rc=$$?; \
	$(BIN)/python -m pytest -m "not kernel" tests || rc=$$?; \
	tools/vmtest || rc=$$?; \
	exit $$rc

setup: deps $(STAMPS)/install guest-kernel viewer

deps:
	@tools/setup-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel cffi 'grpcio-tools==1.85.4' 'greenlet>=3.1'

# An editable install builds xhagent._uring, xhagent._bpf and the BPF objects in place.
$(STAMPS)/install: $(BIN)/python $(NATIVE_SOURCES) | deps
	@mkdir -p $(STAMPS)
	@echo "installing xhagent into $(VENV) (native build: .cache/install.log)"
	@$(BIN)/python -m pip install --no-build-isolation -e '.[test]' > .cache/install.log 2>&1 \
	  || { tail -n 40 .cache/install.log; echo "make: install failed, full log in .cache/install.log" >&2; exit 1; }
	@touch $@

guest-kernel: deps
	@tools/guest-kernel >/dev/null

# speedscope from npm into .cache/speedscope: the offline viewer of Chrome trace exports.
viewer: deps
	@tools/setup-viewer >/dev/null

# dist/xhagent_<version>_amd64.deb and dist/xhagent-<version>.x86_64.rpm (packaging/README.md).
package: deps $(BIN)/python
	$(BIN)/python packaging/build.py --out dist

test-host: setup
	$(BIN)/python -m pytest -m "not kernel" tests

test-kernel: setup
	tools/vmtest

clean:
	rm -rf build dist *.egg-info agent/*.so agent/bpf/objects ebpf/vmlinux.h native/_*.c $(STAMPS)
