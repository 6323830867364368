# Vigil: two commands on a fresh machine.
#   make run    set up, build the default benchmark, start the whole stack (vigil up)
#   make test   set up and run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PROTO_SRC := $(shell find proto/vigil -name '*.proto')
PROTO_STAMP := proto/.generated
ARGS ?=

.PHONY: all setup system-deps proto lint test test-fast bench run clean

all: test

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[hf,dev]'
	@touch $(STAMP)

$(PROTO_STAMP): $(PROTO_SRC) $(STAMP)
	$(PY) -m grpc_tools.protoc -I proto --python_out=proto --grpc_python_out=proto --pyi_out=proto $(PROTO_SRC)
	@for d in $$(find proto/vigil -type d); do touch $$d/__init__.py; done
	@touch $(PROTO_STAMP)

setup: $(STAMP) $(PROTO_STAMP)

proto: $(STAMP)
	@rm -f $(PROTO_STAMP)
	@$(MAKE) --no-print-directory $(PROTO_STAMP)

# Debian packages the tests use: prometheus (promtool checks the alert rules).
system-deps:
	@command -v promtool >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

node_modules/.bin/buf: package.json
	npm install --no-audit --no-fund --silent
	@touch $@

lint: setup node_modules/.bin/buf
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy benchmark cli dashboard gateway grader model_servers rpc
	node_modules/.bin/buf lint proto

test: setup system-deps
	$(PY) -m pytest tests --ignore=tests/bench -q $(PYTEST_ARGS)

bench: setup
	$(PY) -m pytest tests/bench -q -s -m bench

run: setup
	$(VENV)/bin/vigil up $(ARGS)

clean:
	rm -rf $(VENV) $(PROTO_STAMP) node_modules
	find proto/vigil -name '*_pb2*' -delete
