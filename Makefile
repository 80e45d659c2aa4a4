# Two commands: `make run` starts the server, `make test` runs the whole suite.
# Both create .venv when missing and install what they need into it.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Extra server flags, e.g. make run ARGS='--engine echo --port 9000'
ARGS ?=
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# espeak-ng: speech fixtures; chromium: browser tests; redis-server: the cluster tests (each
# starts its own on a free port); the rest: the interop tests' GStreamer
# clients (webrtcbin through Debian's python3-gi, simple-whip-client) in a network namespace.
DEBIAN_TEST_PACKAGES := espeak-ng chromium iproute2 redis-server libpython3.11 python3-gi python3-gst-1.0 \
	gir1.2-gst-plugins-bad-1.0 gstreamer1.0-nice gstreamer1.0-plugins-base \
	gstreamer1.0-plugins-good gstreamer1.0-plugins-bad simple-whip-client

.PHONY: run test install install-test system-test-deps lint bench clean cosyvoice triton-standin

run: install
	$(PY) -m server serve $(ARGS)

test: install-test system-test-deps cosyvoice triton-standin lint
	$(PY) -m pytest -q

install: $(STAMP)
install-test: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# silero-vad's metadata requires torch, which the server does not use: only the ONNX file the
# wheel bundles is read (media/audio/vad.py), so it goes in without its dependencies.
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps silero-vad==6.2.3
	touch $@

# The example engine plugin is a package of its own: the suite calls it over a real call.
$(TEST_STAMP): $(STAMP) pyproject.toml examples/engine-plugin/pyproject.toml
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q -e examples/engine-plugin
	touch $@

# CosyVoice2 engines (optional for `make run`, part of `make test`): torch from its pinned CPU
# wheel, the upstream neural modules without their metadata's dependencies (onnxruntime-gpu,
# torchaudio, modelscope, openai-whisper: none is used), then our pinned requirements.
COSYVOICE_STAMP := $(VENV)/.installed-cosyvoice
TORCH_VERSION := 2.13.0
COSYVOICE_MODULES := cosyvoice-minicpmo==0.1.0

cosyvoice: $(COSYVOICE_STAMP)

$(COSYVOICE_STAMP): $(STAMP) requirements/cosyvoice.txt
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -r requirements/cosyvoice.txt
	$(PIP) install -q --no-deps $(COSYVOICE_MODULES)
	touch $@

# The Triton stand-in (tests/triton, scripts/triton_standin.py) in an environment of its own:
# the CPU tritonserver and Python backend inside nvidia-pytriton, whose backend needs
# numpy < 2 (the server's has numpy 2). It lives inside .venv, which git and the linters
# skip. The wheel goes in --no-deps: only its server binaries are used. Its backend stub
# embeds Debian's libpython3.11 (in DEBIAN_TEST_PACKAGES).
TRITON_VENV := $(VENV)/triton
TRITON_STAMP := $(TRITON_VENV)/.installed
TRITON_SERVER := nvidia-pytriton==0.7.0

triton-standin: $(TRITON_STAMP)

$(TRITON_STAMP): requirements/triton-standin.txt
	rm -rf $(TRITON_VENV)
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q --upgrade pip
	$(TRITON_VENV)/bin/pip install -q -r requirements/triton-standin.txt
	$(TRITON_VENV)/bin/pip install -q --no-deps $(TRITON_SERVER)
	touch $@

# Debian packages the tests use (speech fixtures, the browser tests). Installed when missing and running as
# root; otherwise the command to run is printed and the step fails.
system-test-deps:
	@missing=""; for pkg in $(DEBIAN_TEST_PACKAGES); do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages:$$missing; run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

# Style, the layer rule (import-linter contracts in pyproject.toml) and types.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

bench: install-test
	$(PIP) install -q -e '.[bench]'
	$(PY) -m bench.rtt
	$(PY) -m bench.tts
	$(PY) -m bench.capacity

clean:
	rm -rf $(VENV) .pytest_cache
