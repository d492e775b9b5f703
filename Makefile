# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := $(VENV)/.deploy-tools

.PHONY: demo test bench soak venv deploy-tools clean

demo: $(STAMP)  ## run the main job on the embedded default stack
	$(BIN)/banditstream demo $(ARGS)

# TEST_WORKERS=2 runs two pytest workers, a test file each at a time (`--dist loadfile`: a
# module's fixtures stay on one worker), each with its own broker and S3 server on free ports:
# on two cores (2026-11-29) 1,749-1,770 tests in 594-616 s against 1,109 s in one process. Not
# the default: one clean-clone run in three failed a timing-bound claim (the assistant_routing
# example's rewards missed their window, 0.936 of them rewarded, under the other worker's load).
TEST_WORKERS ?= 0

test: $(STAMP) $(TOOLS)  ## run the whole test suite (starts its own broker and S3 server)
	$(BIN)/pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile $(ARGS)

bench: $(STAMP)  ## run the benchmarks; each prints a table and a final JSON line
	$(BIN)/python benchmarks/serde.py
	$(BIN)/python benchmarks/learner.py
	$(BIN)/python benchmarks/snapshot.py
	$(BIN)/python benchmarks/pipeline.py

soak: $(STAMP)  ## a bounded chaos run: 15 min, 30 faults, 100,000 fuzzed bad records (not part of `make test`)
	$(BIN)/python benchmarks/soak.py $(ARGS)

venv: $(STAMP)

deploy-tools: $(TOOLS)  ## docker-compose, promtool and helm for tests/test_deploy.py (apt-get needs root)

$(TOOLS): $(STAMP) deploy/install-tools.sh
	BIN=$(BIN) bash deploy/install-tools.sh
	touch $(TOOLS)

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .banditstream .pytest_cache build *.egg-info
