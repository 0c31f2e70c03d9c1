# Local cluster targets (owned by hack/). Placeholder until the cluster lands.
.PHONY: cluster-prereqs
cluster-prereqs:
	@true
