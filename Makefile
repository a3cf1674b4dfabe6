# Quick start: `make run` (demo stack) and `make test` (whole suite). Both install what they need first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CACHE := $(CURDIR)/.cache
export PIP_CACHE_DIR := $(CACHE)/pip
STAMP := $(VENV)/.installed

.PHONY: install native kafka-jars deploy-tools bench-tools browser hey lint test run stop protos bench soak clean

NATIVE_SRC := native/Cargo.toml native/pyproject.toml native/embedgate_native.pyi $(wildcard native/src/*.rs)
CARGO ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)

install: $(STAMP)

$(STAMP): pyproject.toml $(NATIVE_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tf,dev]'
	$(MAKE) native
	touch $@

# The compiled hot path (native/, a Rust crate built by maturin into the module embedgate_native, used through
# gateway/native.py). Cargo's downloads and build outputs live under .cache (git-ignored), 2 build jobs at most.
native:
	@test -x "$(CARGO)" || command -v "$(CARGO)" >/dev/null || { echo "make native: cargo (the Rust toolchain, 1.80 or newer) is missing. Install it with rustup, the Rust project's installer (profile minimal), or your distribution's package (Debian: apt-get install cargo), then open a new shell" >&2; exit 1; }
	cd native && PATH="$$(dirname $(CARGO)):$$PATH" CARGO_HOME=$(CACHE)/cargo CARGO_TARGET_DIR=$(CACHE)/cargo-target \
	  CARGO_BUILD_JOBS=2 VIRTUAL_ENV=$(abspath $(VENV)) $(abspath $(VENV))/bin/maturin develop --release --quiet

# The Kafka broker's jars from Maven Central, cached under .cache/kafka (git-ignored).
kafka-jars: install
	$(PY) -m embedgate kafka fetch

# Helm (from the Go module proxy) and tools/deploycheck (compose-spec loader + strict Kubernetes API decoding), built
# into .cache/go-bin (git-ignored) with Go's module cache under .cache/go.
GOBIN_DIR := $(CACHE)/go-bin
HELM_VERSION := v3.22.0
GO_ENV := GOPATH=$(CACHE)/go GOFLAGS=-modcacherw GOTOOLCHAIN=local
deploy-tools: $(GOBIN_DIR)/helm $(GOBIN_DIR)/deploycheck

$(GOBIN_DIR)/helm:
	$(GO_ENV) GOBIN=$(GOBIN_DIR) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(GOBIN_DIR)/deploycheck: tools/deploycheck/go.mod tools/deploycheck/go.sum tools/deploycheck/main.go
	cd tools/deploycheck && $(GO_ENV) go build -o $@ .

# Load generators for `make bench`: ghz (gRPC) and vegeta (HTTP), from the Go module proxy into .cache/go-bin.
bench-tools: $(GOBIN_DIR)/ghz $(GOBIN_DIR)/vegeta $(VENV)/bin/py-spy

# the sampling profiler of `benchmarks.gateway_perf_profile --profiler py-spy` and `benchmarks.dlrm_bench --profile py-spy`
$(VENV)/bin/py-spy: | $(STAMP)
	$(PY) -m pip install -q py-spy==0.4.3

$(GOBIN_DIR)/ghz:
	$(GO_ENV) GOBIN=$(GOBIN_DIR) go install github.com/bojand/ghz/cmd/ghz@v0.93.0

$(GOBIN_DIR)/vegeta:
	$(GO_ENV) GOBIN=$(GOBIN_DIR) go install github.com/tsenart/vegeta/v12@v12.13.0

# Debian's chromium + chromium-driver for the headless-browser test of /docs (tests/gateway/test_docs_browser.py);
# apt runs only when one of them is missing (needs root, or sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; else \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver; \
	fi

# mypy --strict on schemas, tfs_grpc, gateway, updater, embedgate, benchmarks ([tool.mypy] in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The suite runs in PYTEST_WORKERS processes (pytest-xdist), each test file on one of them; PYTEST_WORKERS=0 runs it
# in this process alone.
PYTEST_WORKERS ?= 2
test: install kafka-jars deploy-tools browser lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=30 $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# Builds the demo model if missing, starts Kafka, serve-local (entry + PS), the updater and the gateway on
# 127.0.0.1 and stays in the foreground until Ctrl-C; `make stop` stops a stack left running in the background.
run: install kafka-jars
	$(PY) -m embedgate demo run

stop:
	-$(PY) -m embedgate demo stop

# Regenerates schemas/proto/tfs_pb2.py(i) from schemas/proto/tfs.proto.
protos: install
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. schemas/proto/tfs.proto

# The `hey` HTTP load generator (Go module proxy) for benchmarks/workers_bench.py, into .cache/go-bin.
hey: $(GOBIN_DIR)/hey
$(GOBIN_DIR)/hey:
	$(GO_ENV) GOBIN=$(GOBIN_DIR) go install github.com/rakyll/hey@v0.1.5

bench: install kafka-jars bench-tools hey
	$(PY) -m benchmarks.run

# A bounded soak of the whole stack (about 5 minutes; not part of `make test`): predicts + updates, a PS replica
# SIGKILLed and restarted, then every key checked on every replica and RSS growth judged; docs/reliability.md "Soak".
# SOAK_ARGS passes flags, e.g. `make soak SOAK_ARGS="--duration 600 --write"`.
soak: install kafka-jars
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
