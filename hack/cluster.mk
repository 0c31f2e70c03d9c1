# The local cluster (hack/, see README "Local cluster" and DESIGN.md § Local cluster).
# A real multi-node Kubernetes v1.20.2 on this machine (root; no Docker): control plane on the
# host, every node a network namespace with its own containerd, kubelet and kube-proxy.
LOCALCLUSTER := PYTHONPATH=hack $(PY) -m localcluster
KIND_NAME ?= disttrain
KIND_VOLUMES := /var/lib/disttrain/volumes

.PHONY: cluster-prereqs cluster-up cluster-down cluster-status images image-cuda wheelhouse kind-up kind-down

cluster-prereqs: $(STAMP) ## Debian packages, Kubernetes binaries (cached) and images (rebuilt when inputs change)
	hack/install-deps.sh
	hack/build-k8s.sh >/dev/null
	$(LOCALCLUSTER) images

cluster-up: cluster-prereqs ## start the local cluster (NODES=2, GPUS="2=2"); prints the kubeconfig path
	DISTTRAIN_NODES=$(or $(NODES),2) $(if $(GPUS),DISTTRAIN_GPUS="$(GPUS)") $(LOCALCLUSTER) up

cluster-down: $(STAMP) ## stop the local cluster and remove its state (caches stay)
	$(LOCALCLUSTER) down

cluster-status: $(STAMP) ## exit 0 when the local cluster is up
	$(LOCALCLUSTER) status

images: cluster-prereqs ## build the pause, test, trainer, operator and example user (my-model) images when their inputs changed

# Several GB, so not part of `make test` or `images`; TORCH_INDEX_URL picks another CUDA build.
image-cuda: $(STAMP) ## build the CUDA trainer image with buildah (torch's CUDA wheels), check its CUDA and cuDNN, print its size
	hack/install-deps.sh buildah umoci debootstrap
	$(LOCALCLUSTER) image-cuda $(if $(TORCH_INDEX_URL),--torch-index $(TORCH_INDEX_URL))

wheelhouse: $(STAMP) ## build/wheels: dependency wheels (torch pinned) + the project wheel, for the Dockerfile
	PYTHONPATH=hack $(PY) -c 'from localcluster import images; images.wheelhouse()'

# For users with Docker: a kind cluster with the same images (loaded, no registry).
kind-up: wheelhouse ## kind cluster "disttrain" (1 control plane + 2 workers): images loaded, shared volumes for claims
	docker build --target trainer -t disttrain-trainer:dev .
	docker build --target operator -t disttrain-operator:dev .
	mkdir -p $(KIND_VOLUMES) /var/lib/disttrain/checkpoints && chmod 1777 $(KIND_VOLUMES) /var/lib/disttrain/checkpoints
	kind get clusters | grep -qx $(KIND_NAME) || kind create cluster --name $(KIND_NAME) --config hack/kind.yaml
	kind load docker-image --name $(KIND_NAME) disttrain-trainer:dev disttrain-operator:dev
	mkdir -p $(HOME)/.cache/disttrain
	kind get kubeconfig --name $(KIND_NAME) > $(HOME)/.cache/disttrain/kind-kubeconfig
	# kind's default StorageClass (local-path) puts each volume on one node and offers only
	# ReadWriteOnce; on a folder every node mounts (hack/kind.yaml) it offers ReadWriteMany.
	kubectl --kubeconfig $(HOME)/.cache/disttrain/kind-kubeconfig -n local-path-storage patch configmap \
	  local-path-config --type merge -p '{"data":{"config.json":"{\"sharedFileSystemPath\":\"$(KIND_VOLUMES)\"}"}}'
	# Advertise 2 nvidia.com/gpu on the last worker, as the local cluster does.
	kubectl --kubeconfig $(HOME)/.cache/disttrain/kind-kubeconfig patch node $(KIND_NAME)-worker2 \
	  --subresource=status --type=json -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"2"}]'
	@echo "export KUBECONFIG=$(HOME)/.cache/disttrain/kind-kubeconfig"

kind-down: ## delete the kind cluster
	kind delete cluster --name $(KIND_NAME)
