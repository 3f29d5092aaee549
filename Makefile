# Top-level tasks. e2e control plane: see e2e/README.md.
SHELL := /bin/bash
# Kubernetes release for the local control plane (default: e2e/k8s-version).
K8S_VERSION ?= $(or $(ST_K8S_VERSION),$(shell cat e2e/k8s-version))
export ST_K8S_VERSION := $(K8S_VERSION)

.PHONY: k8s-bins cluster-up cluster-down e2e-smoke

k8s-bins: ## build etcd, kube-*, kubectl, kwok, helm, promtool, prometheus into ~/.cache/safe-termination/k8s-v$(K8S_VERSION)/bin
	e2e/build-k8s.sh $(K8S_VERSION)

cluster-up: k8s-bins ## start the local control plane (state in $${ST_E2E_DIR:-/tmp/safe-termination-e2e})
	e2e/cluster-up.sh

cluster-down: ## stop it and remove its processes, netns, veths and state
	e2e/cluster-down.sh

e2e-smoke: ## check a running cluster end to end (pods, EndpointSlices, kube-proxy rules/metrics, webhook)
	e2e/smoke-test.sh

.PHONY: test e2e demo check

check: test test-image e2e ## everything .ci/run runs: make test, make test-image (builds the image), then make e2e

test: ## unit, property, integration and CLI tests; benches and examples built, each bench run once (no cluster needed)
	cargo test --all-targets
	cargo test --doc
	cd e2e/testapp && cargo test --quiet
	python3 -m unittest e2e/test_oci_image.py e2e/experiment/test_report.py

e2e: k8s-bins image ## start the local control plane (the operator image imported into its real nodes), run the end-to-end tests, stop it
	e2e/run-e2e.sh

demo: k8s-bins ## the main job: the deploy-error experiment at a small size (one baseline, one protected rollout): table, picture, results.json
	e2e/demo.sh

.PHONY: experiment
experiment: k8s-bins ## the full deploy-error experiment (runs a-d, 4,000 extra Services for c and d); results in target/experiment
	e2e/experiment.sh

.PHONY: image static docker-image test-image

# the image's binary, built the way the Dockerfile builds it, without Docker
static: ## the static musl binary the image ships (installs musl-tools and the rustup musl target when missing)
	@command -v musl-gcc >/dev/null 2>&1 || { s=; [ "$$(id -u)" -eq 0 ] || s=sudo; \
		$$s apt-get install -y musl-tools || { $$s apt-get update -qq && $$s apt-get install -y musl-tools; }; }
	rustup target add $$(uname -m)-unknown-linux-musl
	cargo build --release --locked --target $$(uname -m)-unknown-linux-musl --bin safe-termination
	@b=$${CARGO_TARGET_DIR:-target}/$$(uname -m)-unknown-linux-musl/release/safe-termination; \
		i=$$(python3 image/elf_interp.py "$$b") || exit 1; \
		if [ -n "$$i" ]; then echo "$$b is not static: it asks for the loader $$i" >&2; exit 1; fi; \
		echo "static binary: $$b"; "$$b" --version

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE ?= ghcr.io/safe-termination/safe-termination:$(VERSION)

# Without Docker: the static binary plus what distroless/static:nonroot gives it, packed by
# e2e/oci-image.py into an OCI image-layout tar (image/README.md). With a Docker engine, the
# Dockerfile builds the same image: make docker-image (docker build -t $(IMAGE) .).
image: static ## build the operator image without Docker: OCI archive ~/.cache/safe-termination/images/safe-termination-$(VERSION).tar (prints its path)
	image/build.sh

test-image: image ## check the built image's config and files against the Dockerfile (image/test_image.py)
	python3 -m unittest image/test_image.py

docker-image: ## build the operator image from the Dockerfile with a Docker engine: docker build -t $(IMAGE) .
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
		echo "make docker-image needs a Docker engine (docker build); none is available here." >&2; \
		echo "Without Docker: make image (image/build.sh)." >&2; \
		exit 1; \
	fi
	docker build -t $(IMAGE) .
