# Targets a newcomer needs; each sets up .venv on first use.
.PHONY: demo test test-slow test-all test-fast test-vllm lint typecheck bench docs

demo:
	./scripts/bootstrap.sh
	.venv/bin/eesd demo

# Every test but those marked slow (a second tier, run by CI: make test-slow; both: make test-all)
test:
	./scripts/bootstrap.sh test
	.venv/bin/python -m pytest -q -m "not slow"

test-slow:
	./scripts/bootstrap.sh test
	.venv/bin/python -m pytest -q -m slow

test-all:
	./scripts/bootstrap.sh test
	.venv/bin/python -m pytest -q

# The vLLM proposer in a real vLLM engine (its CPU build, in .venv-vllm: about 3 GB, 3 minutes)
test-vllm:
	./scripts/bootstrap-vllm.sh
	.venv-vllm/bin/python -m pytest -q tests/plugins/vllm_proposer

test-fast:
	./scripts/bootstrap.sh test
	.venv/bin/python -m pytest -q -m "not slow and not model"

lint:
	./scripts/bootstrap.sh dev
	.venv/bin/ruff check .

typecheck:
	./scripts/bootstrap.sh dev
	.venv/bin/mypy

bench:
	./scripts/bootstrap.sh bench
	.venv/bin/eesd bench --per-category 3 --max-new-tokens 128

# The documentation site (docs/, mkdocs.yml) into site/, warnings as errors
docs:
	./scripts/bootstrap.sh docs
	.venv/bin/mkdocs build --strict
