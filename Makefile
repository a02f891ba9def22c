# intellect-node: `make devnet` runs the local devnet, `make test` runs every test.
# Both install what they need on first use (Python venv from requirements.lock, npm toolchain from
# package-lock.json) and skip that step afterwards.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
FORGE  := node_modules/@foundry-rs/forge-linux-amd64/bin/forge
STAMPS := .stamps

.PHONY: test devnet contracts forge-test pytest lint bench install clean

install: $(STAMPS)/venv $(STAMPS)/npm

$(STAMPS)/npm: package.json package-lock.json
	@mkdir -p $(STAMPS)
	npm ci --no-audit --no-fund --loglevel=error
	chmod +x tools/solc-shim.js
	@touch $@

$(STAMPS)/venv: requirements.lock pyproject.toml
	@mkdir -p $(STAMPS)
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

contracts: $(STAMPS)/npm $(STAMPS)/venv
	$(FORGE) build
	$(PY) tools/export_artifacts.py

forge-test: $(STAMPS)/npm
	$(FORGE) test

lint: $(STAMPS)/venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

pytest: $(STAMPS)/venv $(STAMPS)/npm
	$(VENV)/bin/pytest -q

test: $(STAMPS)/npm $(STAMPS)/venv
	$(FORGE) build
	$(PY) tools/export_artifacts.py --check
	$(FORGE) test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

devnet: $(STAMPS)/npm $(STAMPS)/venv
	$(VENV)/bin/intellect-node devnet $(ARGS)

bench: $(STAMPS)/npm $(STAMPS)/venv
	$(PY) bench/gas.py

clean:
	rm -rf $(STAMPS) contracts/out contracts/cache
