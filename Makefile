# Two commands set everything up on a fresh machine: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell sha1sum requirements.txt | cut -c1-12)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint chromium bench demo-model

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# Browser tests drive the system Chromium (never a browser downloaded by a test tool).
chromium:
	@command -v chromium >/dev/null || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium)

run: $(STAMP)
	$(PY) app.py

test: $(STAMP) chromium
	$(PY) -m ruff check engine playground tests app.py
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m engine.bench --help
