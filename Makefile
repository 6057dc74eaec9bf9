# The README's two set-up commands. Each creates .venv with nothing but Python ≥ 3.10 and
# installs hf-icl with the tested, pinned versions in constraints.txt (torch 2.13.0: the CPU
# wheel on machines without CUDA).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: quickstart test lint

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/hf-icl quickstart

# Triton kernels run on CPU tensors under the interpreter; -n 2 uses both CI cores, one thread
# each: two OpenMP threads per worker on two cores make torch matmuls tens of times slower.
test: $(STAMP)
	OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(PY) -m pytest -n 2 -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check hf_icl tests scripts
