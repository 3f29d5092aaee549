# Top-level tasks. e2e control plane: see e2e/README.md.
SHELL := /bin/bash
# Kubernetes release for the local control plane (default: e2e/k8s-version).
K8S_VERSION ?= $(or $(ST_K8S_VERSION),$(shell cat e2e/k8s-version))
export ST_K8S_VERSION := $(K8S_VERSION)

.PHONY: k8s-bins cluster-up cluster-down e2e-smoke

k8s-bins: ## build etcd, kube-*, kubectl, kwok, helm, promtool into ~/.cache/safe-termination/k8s-v$(K8S_VERSION)/bin
	e2e/build-k8s.sh $(K8S_VERSION)

cluster-up: k8s-bins ## start the local control plane (state in $${ST_E2E_DIR:-/tmp/safe-termination-e2e})
	e2e/cluster-up.sh

cluster-down: ## stop it and remove its processes, netns, veths and state
	e2e/cluster-down.sh

e2e-smoke: ## check a running cluster end to end (pods, EndpointSlices, kube-proxy rules/metrics, webhook)
	e2e/smoke-test.sh

.PHONY: test e2e demo check

check: test e2e ## everything .ci/run runs: make test, then make e2e

test: ## unit, property, integration and CLI tests; benches and examples built, each bench run once (no cluster needed)
	cargo test --all-targets
	cargo test --doc
	cd e2e/testapp && cargo test --quiet
	python3 -m unittest e2e/test_oci_image.py e2e/experiment/test_report.py

e2e: k8s-bins ## start the local control plane, run the end-to-end tests, stop it
	e2e/run-e2e.sh

demo: k8s-bins ## the main job: the deploy-error experiment at a small size (one baseline, one protected rollout): table, picture, results.json
	e2e/demo.sh

.PHONY: experiment
experiment: k8s-bins ## the full deploy-error experiment (runs a-d, 4,000 extra Services for c and d); results in target/experiment
	e2e/experiment.sh

.PHONY: image static

# the image's binary, built the way the Dockerfile builds it, without Docker
static: ## the static musl binary the image ships (installs musl-tools and the rustup musl target when missing)
	@command -v musl-gcc >/dev/null 2>&1 || { apt-get install -y musl-tools || sudo apt-get install -y musl-tools; }
	rustup target add $$(uname -m)-unknown-linux-musl
	cargo build --release --locked --target $$(uname -m)-unknown-linux-musl --bin safe-termination
	@b=$${CARGO_TARGET_DIR:-target}/$$(uname -m)-unknown-linux-musl/release/safe-termination; \
		if ldd "$$b" 2>/dev/null | grep -q '=>'; then echo "$$b is not static" >&2; exit 1; fi; \
		echo "static binary: $$b"; "$$b" --version

IMAGE ?= safe-termination:$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

image: ## build the operator image (Dockerfile: static musl binary on distroless/static, uid 65532); needs a Docker engine
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
		echo "make image needs a Docker engine (docker build); none is available here." >&2; \
		echo "Build elsewhere with: docker build -t $(IMAGE) ." >&2; \
		exit 1; \
	fi
	docker build -t $(IMAGE) .
