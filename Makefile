# Two commands on a fresh machine (Python 3.10+ only):
#   make demo   -- install trident in .venv and run `trident demo`
#   make test   -- install trident[test] in .venv and run the test suite
# On a machine without a GPU both run on the CPU emulation (N processes, Triton interpreter).

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# CPU build of PyTorch where there is no GPU; triton pinned to the GPU machines' version.
TORCH_PIN  ?= torch==2.13.0
TRITON_PIN ?= triton==3.6.0

.PHONY: demo test install

$(VENV)/.installed: pyproject.toml
	@echo "make: creating $(VENV) and installing PyTorch, triton and trident into it (quiet; a few minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)" "$(TRITON_PIN)" || $(PY) -m pip install -q torch "$(TRITON_PIN)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	@echo "make demo: running trident demo (all GPUs, or 4 CPU ranks under Triton's interpreter: about a minute there)"
	$(VENV)/bin/trident demo

test: install
	$(PY) -m pytest -q -ra --durations=20 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
