# gemma4-images: `make` lists what it can do. Every target sets up what it needs first.
HW ?= cpu
PY := .venv/bin/python
PYTEST_ARGS ?= -m "not device and not platform and not fullsize"
# Two lanes at once (pytest-xdist, tests/lanes.py): one builds, one serves the images both share; unit tests fill
# both. LANES=0 runs everything in this process, one test at a time.
LANES ?= 2

.DEFAULT_GOAL := help
.PHONY: help host host-build emulation tools release quickstart image images base bump render lint lock smoke check-fixes port-fixes test test-fresh test-fast test-publish test-arm64 test-fullsize list bench

help: ## Show targets and variables
	@echo "usage: make <target> [HW=<hardware>]"
	@echo
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'
	@echo
	@echo 'variables: HW=<target or alias> (default cpu; see `make list`), PYTEST_ARGS (default $(PYTEST_ARGS)),'
	@echo '  LANES (default $(LANES)), VLLM=<release> (default: the release `make list` marks with *)'

host: ## Install and start what builds and tests need (Docker engine, mmdebstrap, the tests' venv)
	@scripts/setup-host.sh test

# Building and serving need only requirements/build.lock: no torch, a tenth of the tests' venv.
host-build: ## The same with the build venv only (what building and serving images need)
	@scripts/setup-host.sh build

tools: ## Install cosign and oras (Debian trixie's, sha256-pinned in requirements/trixie-tools.lock) for pin, push, verify
	@scripts/setup-tools.sh

release: host-build tools ## Build, smoke, push signed by cosign, verify: make release HW=cpu REGISTRY=R COSIGN_KEY=cosign.key [RELEASE_ARGS=--tiny] [VLLM=...]
	@test -n "$(REGISTRY)" -a -n "$(COSIGN_KEY)" || { echo "usage: make release HW=<target> REGISTRY=HOST/NS COSIGN_KEY=cosign.key [RELEASE_ARGS=--tiny]"; exit 2; }
	$(PY) build.py release $(HW) --registry $(REGISTRY) --cosign-key $(COSIGN_KEY) $(if $(VLLM),--vllm $(VLLM)) $(RELEASE_ARGS)

quickstart: host-build ## Build the CPU image with no registry or hub, serve a tiny Gemma 4, get answers
	$(PY) build.py base cpu
	$(PY) build.py build cpu --tiny
	$(PY) build.py smoke cpu --tiny

list: host-build ## List every target with its base image and tag
	@$(PY) build.py list

image: host-build ## Build one image: make image HW=h100 [VLLM=0.32.0, another release of releases/]
	$(PY) build.py build $(HW) $(if $(VLLM),--vllm $(VLLM))

images: host-build ## Build every target's image
	$(PY) build.py build all

base: host-build ## Build HW's local stand-in base without a registry (the targets `make list` gives a STAND-IN) [VLLM=...]
	$(PY) build.py base $(HW) $(if $(VLLM),--vllm $(VLLM))

bump: host-build ## Build a family on another vLLM release: make bump FAMILY=cpu VLLM=0.32.0 [BUMP_ARGS=--accept-merge FIX]; VLLM unset: which are behind
	$(if $(VLLM),$(PY) build.py bump $(FAMILY) --vllm $(VLLM) $(BUMP_ARGS),$(PY) build.py bump --check)

render: host-build ## Re-render Dockerfile.* and image/recipes/ from targets.yaml
	$(PY) build.py render

lint: host ## render --check, ruff (lint and format), then hadolint every Dockerfile (each inline ignore says why)
	$(PY) build.py render --check
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/hadolint --no-color Dockerfile.* bases/*/Dockerfile

lock: host ## Re-resolve requirements/*.in and the stand-in bases into the hashed locks; commit them
	scripts/lock.sh

check-fixes: host ## Apply the vllm-gaudi fixes to a checkout and run their tests: VLLM_GAUDI_SRC=DIR [COVERAGE=1 [RECORD=1]] [ALLOW_SKIPS=1]
	@test -n "$(VLLM_GAUDI_SRC)" || { echo "usage: make check-fixes VLLM_GAUDI_SRC=/path/to/vllm-gaudi [COVERAGE=1 [RECORD=1]] [ALLOW_SKIPS=1]"; exit 2; }
	scripts/check-fixes.sh $(if $(ALLOW_SKIPS),--allow-skips) $(if $(COVERAGE),--hunk-coverage) $(if $(RECORD),--record) "$(VLLM_GAUDI_SRC)"

port-fixes: host ## Rebase the vllm-gaudi fixes onto another checkout (3-way merge), then test: VLLM_GAUDI_SRC=DIR
	@test -n "$(VLLM_GAUDI_SRC)" || { echo "usage: make port-fixes VLLM_GAUDI_SRC=/path/to/vllm-gaudi [PYTHON=...] [PORT_ARGS='--out DIR --accept-merge --in-place']"; exit 2; }
	$(PY) scripts/port-fixes.py "$(VLLM_GAUDI_SRC)" $(PORT_ARGS)

smoke: host-build ## Smoke-test HW's built image (add SMOKE_ARGS="--tiny" for the tiny CPU model) [VLLM=...]
	$(PY) build.py smoke $(HW) $(if $(VLLM),--vllm $(VLLM)) $(SMOKE_ARGS)

test: host ## Run the test suite (unit + integration with a real Docker engine), in two lanes
	$(PY) -m pytest $(PYTEST_ARGS) $(if $(filter-out 0,$(LANES)),-n $(LANES))

# The unit tests that are quick: no Docker, no accelerator, none marked slow (pytest.ini). The
# real-wheel checks download their wheels once per machine, then take seconds.
test-fast: host ## The quick unit tests, for edit-test loops (no Docker; ~1 min)
	$(PY) -m pytest -m "not integration and not device and not slow and not fullsize" tests/unit

# What a fresh machine (or a new CI runner) gets: the project's images removed and the build cache
# emptied, then `make test` in a fresh clone; its time and disk go to BENCHMARKS.md.
test-fresh: host ## make test as a fresh machine runs it (removes the project's images and build cache; ~40 min)
	$(PY) build.py bench --no-build --no-serving --no-startup --no-load --no-pod --tests-fresh

# The supply chain's own lane (tests/lanes.py PUBLISH): what a change to publish/ or the registry
# tools needs, without the image core's serving tests (~10 min warm).
test-publish: host tools ## The supply-chain tests alone: push, cosign, oras, SBOM, provenance, contract, pin, pipelines
	$(PY) -m pytest -m "publish and not fullsize"

# The linux/arm64 tier: the arm64 CPU stand-in, the xeon6 image and its smoke, under qemu. Too slow
# for every CI run: CI runs it when what it proves changed (tests/platform_tier.py); on a pass it
# records that in tests/platform-tier.json, which is committed. Its arm64 images (~15 GB) are
# removed afterwards, passed or not: a fresh machine's disk does not hold them beside the rest.
test-arm64: host emulation ## The linux/arm64 tier under qemu: base, image, full smoke, one index with amd64 (~25 min)
	$(PY) -m pytest -m platform tests/integration/test_arm64.py; \
	  status=$$?; $(PY) -m tests.platform_tier --clean; test $$status = 0
	$(PY) -m tests.platform_tier --record

# The full-size tier: random weights of E2B's shape (10.2 GB) served by the CPU image with the
# recipe's launch. Alone on the machine (it needs ~20 GiB of memory); CI runs it when what it proves
# changed (tests/fullsize_tier.py). The cached folder is removed afterwards, passed or not.
test-fullsize: host ## The full-size tier: E2B's shape in the CPU image, recipe launch, every endpoint (~15 min)
	$(PY) -m pytest -m fullsize tests/unit/test_e2b_shape.py tests/integration/test_fullsize.py tests/integration/test_fullsize_tp.py; \
	  status=$$?; $(PY) -m tests.fullsize_tier --clean; test $$status = 0
	$(PY) -m tests.fullsize_tier --record

emulation: ## Make this x86_64 host run arm64 programs (trixie's qemu 10 through binfmt_misc; root)
	@scripts/setup-emulation.sh

bench: host ## Rebuild costs, image overhead and the serving harness on the CPU image; writes BENCHMARKS.md
	$(PY) build.py bench $(BENCH_ARGS)
