# Top-level tasks. e2e control plane: see e2e/README.md.
SHELL := /bin/bash
# Kubernetes release for the local control plane (default: e2e/toolchain/k8s-version).
K8S_VERSION ?= $(or $(ST_K8S_VERSION),$(shell cat e2e/toolchain/k8s-version))
export ST_K8S_VERSION := $(K8S_VERSION)

.PHONY: k8s-bins cluster-bins cluster-up cluster-down e2e-smoke

k8s-bins: ## build etcd, kube-*, kubectl, kwok, helm, promtool, prometheus into ~/.cache/safe-termination/k8s-v$(K8S_VERSION)/bin
	e2e/toolchain/build-k8s.sh $(K8S_VERSION)

cluster-up: k8s-bins ## start the local control plane (state in $${ST_E2E_DIR:-/tmp/safe-termination-e2e})
	e2e/cluster/cluster-up.sh

cluster-down: ## stop it and remove its processes, netns, veths and state
	e2e/cluster/cluster-down.sh

e2e-smoke: ## check a running cluster end to end (pods, EndpointSlices, kube-proxy rules/metrics, webhook)
	e2e/cluster/smoke-test.sh

.PHONY: test test-tools e2e demo check fuzz fuzz-build

check: test test-image e2e ## everything .ci/run runs: make test, make test-image (builds the image), then make e2e

test-tools: ## only what make test runs besides cargo: helm and promtool (tests/chart_render.rs), built like make k8s-bins
	ST_BUILD_ONLY="helm promtool" e2e/toolchain/build-k8s.sh $(K8S_VERSION)

test: test-tools ## style (rustfmt, clippy -D warnings, shellcheck), then unit, property, integration and CLI tests; benches and examples built, each bench run once; each fuzz target for FUZZ_TEST_SECONDS (5) (no cluster needed)
	cargo fmt --all -- --check
	cd e2e/testapp && cargo fmt -- --check
	cd fuzz && cargo fmt -- --check
	cargo clippy --all-targets --features cluster-tests -- -D warnings
	tools/shellcheck.sh
	cargo test --all-targets
	cargo test --doc
	cd e2e/testapp && cargo test --quiet
	python3 -m unittest image/test_oci_image.py e2e/experiment/test_report.py
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_TEST_SECONDS)

# Coverage-guided fuzzing (fuzz/README.md): cargo-fuzz and libFuzzer on the stable toolchain,
# no sanitizer. Each target for FUZZ_SECONDS, one at a time, at the lowest priority; new inputs
# go to target/fuzz-corpus/<target>, the committed corpus fuzz/corpus/<target> is only read.
# One process per run (libFuzzer without -jobs; -jobs=1 would fork one child that logs to a file).
FUZZ_SECONDS ?= 60
# what `make test` gives each target: a short run on top of the corpus replay (tests/fuzz_corpora.rs)
FUZZ_TEST_SECONDS ?= 5
FUZZ_TARGETS := text_parser protobuf native review mutate_yaml configz configmap go_duration policy_spec agent_answer rule_listing observe_wire nft_netlink cilium_lb
# the dictionary of each target (fuzz/dict/)
FUZZ_DICT_text_parser := metrics
FUZZ_DICT_protobuf := protobuf
FUZZ_DICT_native :=
FUZZ_DICT_review := admission
FUZZ_DICT_mutate_yaml := yaml
FUZZ_DICT_configz := configz
FUZZ_DICT_configmap := configmap
FUZZ_DICT_go_duration := duration
FUZZ_DICT_policy_spec := policy
FUZZ_DICT_agent_answer := agent
FUZZ_DICT_rule_listing := rules

fuzz-build: ## build every fuzz target (installs cargo-fuzz when missing)
	@command -v cargo-fuzz >/dev/null 2>&1 || nice -n 19 cargo install --locked cargo-fuzz
	nice -n 19 cargo fuzz build --sanitizer none

fuzz: fuzz-build ## run every fuzz target for FUZZ_SECONDS each (default 60), one after the other; fails on a crash
	@set -eo pipefail; $(foreach t,$(FUZZ_TARGETS),echo "== fuzz $(t): $(FUZZ_SECONDS) s"; mkdir -p target/fuzz-corpus/$(t); \
		nice -n 19 cargo fuzz run --sanitizer none $(t) target/fuzz-corpus/$(t) fuzz/corpus/$(t) -- \
		-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -max_len=16384 \
		$(if $(FUZZ_DICT_$(t)),-dict=fuzz/dict/$(FUZZ_DICT_$(t)).dict) 2>&1 | grep -v '^#[0-9]'; )

e2e: k8s-bins image ## start the local control plane (the operator image imported into its real nodes), run the end-to-end tests, stop it
	e2e/run-e2e.sh

cluster-bins: ## only what a cluster runs (etcd, kube-*, kubectl, kwok, kubelet, containerd): make k8s-bins without helm, promtool and prometheus
	ST_CLUSTER_ONLY=1 e2e/toolchain/build-k8s.sh $(K8S_VERSION)

.PHONY: cilium-bins
cilium-bins: ## build cilium-agent, cilium-cni, cilium-dbg (Cilium 1.20.2) with its bpf/ and CRDs, and unpack Debian's clang 19, into ~/.cache/safe-termination/cilium-v1.20.2 (the Cilium node of make e2e's second cluster: e2e/cluster/cilium.sh)
	e2e/toolchain/build-cilium.sh

demo: cluster-bins ## the main job: the deploy-error experiment at a small size (one baseline, one protected rollout): table, picture, results.json
	e2e/experiment/demo.sh

.PHONY: experiment
experiment: k8s-bins ## the full deploy-error experiment (runs a-h: new-connection and keep-alive clients, 4,000 extra Services for c and d); results in target/experiment
	e2e/experiment/experiment.sh

.PHONY: experiment-slow-sync
experiment-slow-sync: k8s-bins ## the slow-sync regime (runs i, j: 12,000 extra Services, node-a's sync p99 above 1 s); results in target/experiment-slow-sync
	ST_EXP_RUNS=i,j ST_EXP_ROLLOUTS=1 ST_EXP_OUT=$(CURDIR)/target/experiment-slow-sync e2e/experiment/experiment.sh

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
# image/oci_image.py into an OCI image-layout tar (image/README.md). With a Docker engine, the
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
