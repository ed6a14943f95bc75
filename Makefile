# Two commands set everything up on a fresh machine: `make run` and `make test`.
VENV      := .venv
PY        := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-$(shell cat requirements.txt | sha1sum | cut -c1-12)
TEST_STAMP:= $(VENV)/.test-$(shell cat requirements.txt requirements-test.txt | sha1sum | cut -c1-12)
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint kernels chromium demo-model demo-draft gpu-check

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The CPU wheel of torch is pinned in requirements.txt, so no multi-GB CUDA build is pulled here.
$(RUN_STAMP): requirements.txt | $(VENV)/bin/python
	$(PY) -m pip install -q -r requirements.txt
	rm -f $(VENV)/.run-* && touch $@

$(TEST_STAMP): requirements-test.txt $(RUN_STAMP)
	$(PY) -m pip install -q -r requirements-test.txt
	rm -f $(VENV)/.test-* && touch $@

# The engine's C++ CPU kernels (engine/model/csrc), compiled once per source and torch version into build/
# (about a minute on two cores; a no-op when that build exists). Without them the engine runs pure PyTorch.
# Then optimum-quanto's CPU extension, which quanto would otherwise compile inside the first quanto-int4 load.
kernels: $(RUN_STAMP)
	$(PY) -c 'from engine.model.cpu_kernels import build; print("CPU kernels:", build())'
	$(PY) -c 'from engine.quant.quanto_levels import build_cpu_extension as b; print("quanto CPU extension:", b())'

# Browser tests drive the system Chromium (never a browser downloaded by a test tool).
chromium:
	@command -v chromium >/dev/null || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium)

run: $(RUN_STAMP) kernels
	$(PY) app.py

test: $(TEST_STAMP) chromium kernels
	$(PY) -m ruff check engine playground tests app.py
	$(PY) -m pytest -q

lint: $(TEST_STAMP)
	$(PY) -m ruff check engine playground tests app.py

# Rebuilds the bundled demo pair in assets/models with the program's defaults (84 min on an idle
# 2-core machine with two threads; budgets are step counts, so a busy machine only takes longer); the card
# compares it with the target it replaces. CI never retrains.
demo-model: $(RUN_STAMP)
	$(PY) -m engine.training --compare-with assets/models/demo-chat --threads 2

# Re-distills only the draft from the bundled target.
demo-draft: $(RUN_STAMP)
	$(PY) -m engine.training --reuse-target

gpu-check: $(RUN_STAMP)
	$(PY) -m engine.gpu_check
