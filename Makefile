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

test: test-tools ## style (rustfmt, clippy -D warnings, shellcheck, actionlint, the Markdown pages' relative links and versioned commands), then unit, property, integration and CLI tests; benches and examples built, each bench run once; each fuzz target for FUZZ_TEST_SECONDS (5) (no cluster needed)
	cargo fmt --all -- --check
	cd e2e/testapp && cargo fmt -- --check
	cd waiter && cargo fmt -- --check
	cd fuzz && cargo fmt -- --check
	cargo clippy --all-targets --features cluster-tests -- -D warnings
	cd waiter && cargo clippy --all-targets -- -D warnings
	tools/shellcheck.sh
	tools/actionlint.sh
	cargo test --all-targets
	cargo test --doc
	cd e2e/testapp && cargo test --quiet
	cd waiter && cargo test --quiet
	python3 -m unittest image/test_oci_image.py image/test_oci_index.py image/test_run_binary.py e2e/experiment/test_report.py tools/test_doc_links.py
	$(MAKE) --no-print-directory doc-versions
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

e2e: k8s-bins image ## the release targets against a real registry (make registry-test), then start the local control plane (the operator's image and chart pushed to its registry, pulled by its real nodes), run the end-to-end tests, stop it
	$(MAKE) --no-print-directory registry-test ST_OPERATOR_IMAGE="$(or $(ST_OPERATOR_IMAGE),$(IMAGE_ARCHIVE))"
	e2e/run-e2e.sh

cluster-bins: ## only what a cluster runs (etcd, kube-*, kubectl, kwok, kubelet, containerd): make k8s-bins without helm, promtool and prometheus
	ST_CLUSTER_ONLY=1 e2e/toolchain/build-k8s.sh $(K8S_VERSION)

.PHONY: cilium-bins
cilium-bins: ## build cilium-agent, cilium-cni, cilium-dbg (Cilium 1.20.2) with its bpf/ and CRDs, and unpack Debian's clang 19, into ~/.cache/safe-termination/cilium-v1.20.2 (the Cilium node of make e2e's second cluster: e2e/cluster/cilium.sh)
	e2e/toolchain/build-cilium.sh

demo: cluster-bins ## the main job: the deploy-error experiment at a small size (one baseline, one protected rollout): table, picture, results.json
	e2e/experiment/demo.sh

.PHONY: experiment
experiment: k8s-bins ## the full deploy-error experiment (runs a-h: new-connection and keep-alive clients, 4,000 extra Services for c and d; w and x: the preStop Wait handler at 0 and 4,000); results in target/experiment
	e2e/experiment/experiment.sh

.PHONY: experiment-slow-sync
experiment-slow-sync: k8s-bins ## the slow-sync regime (runs i, j: 12,000 extra Services, node-a's sync p99 above 1 s); results in target/experiment-slow-sync
	ST_EXP_RUNS=i,j ST_EXP_ROLLOUTS=1 ST_EXP_OUT=$(CURDIR)/target/experiment-slow-sync e2e/experiment/experiment.sh

.PHONY: image static docker-image test-image

# the image's two binaries (the operator, the preStop waiter), built the way the Dockerfile builds them, without Docker
static: ## the two static musl binaries the image ships, the operator and the preStop waiter (waiter/) (installs musl-tools and the rustup musl target when missing)
	@command -v musl-gcc >/dev/null 2>&1 || { s=; [ "$$(id -u)" -eq 0 ] || s=sudo; \
		$$s apt-get install -y musl-tools || { $$s apt-get update -qq && $$s apt-get install -y musl-tools; }; }
	rustup target add $$(uname -m)-unknown-linux-musl
	cargo build --release --locked --target $$(uname -m)-unknown-linux-musl --bin safe-termination
	@b=$${CARGO_TARGET_DIR:-target}/$$(uname -m)-unknown-linux-musl/release/safe-termination; \
		i=$$(python3 image/elf_interp.py "$$b") || exit 1; \
		if [ -n "$$i" ]; then echo "$$b is not static: it asks for the loader $$i" >&2; exit 1; fi; \
		echo "static binary: $$b"; "$$b" --version
	cd waiter && cargo build --release --locked --target $$(uname -m)-unknown-linux-musl
	@case "$${CARGO_TARGET_DIR:-}" in "") d=waiter/target ;; /*) d=$$CARGO_TARGET_DIR ;; *) d=waiter/$$CARGO_TARGET_DIR ;; esac; \
		b=$$d/$$(uname -m)-unknown-linux-musl/release/safe-termination-wait; \
		i=$$(python3 image/elf_interp.py "$$b") || exit 1; \
		if [ -n "$$i" ]; then echo "$$b is not static: it asks for the loader $$i" >&2; exit 1; fi; \
		echo "static binary: $$b, $$(stat -c %s "$$b") bytes"

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE ?= ghcr.io/safe-termination/safe-termination:$(VERSION)

# Without Docker: the static binary plus what distroless/static:nonroot gives it, packed by
# image/oci_image.py into an OCI image-layout tar (image/README.md). With a Docker engine, the
# Dockerfile builds the same image: make docker-image (docker build -t $(IMAGE) .).
image: static ## build the operator image without Docker: OCI archive ~/.cache/safe-termination/images/safe-termination-$(VERSION).tar (prints its path)
	image/build.sh

test-image: image ## check the built image's config and files against the Dockerfile (image/test_image.py), and start its binaries (image/run_binary.py)
	python3 -m unittest image/test_image.py
	$(MAKE) --no-print-directory image-run IMAGE_ARCHIVES="$(or $(ST_OPERATOR_IMAGE),$(IMAGE_ARCHIVE))"

docker-image: ## build the operator image from the Dockerfile with a Docker engine: docker build -t $(IMAGE) .
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
		echo "make docker-image needs a Docker engine (docker build); none is available here." >&2; \
		echo "Without Docker: make image (image/build.sh)." >&2; \
		exit 1; \
	fi
	docker build -t $(IMAGE) .

# ------------------------------------------------------------------ release: a registry's image index and chart
# The image as a multi-platform index and the chart as an OCI artifact, pushed to REGISTRY (a host
# with an optional path: 127.0.0.1:5000, ghcr.io/OWNER): $(REGISTRY)/safe-termination:$(VERSION)
# and $(REGISTRY)/charts/safe-termination:$(CHART_VERSION). docs/install.md "From a registry";
# the release workflow (.github/workflows/release.yml) runs these targets.
.PHONY: registry-bins registry-test image-index image-run chart-push registry-login release-check doc-versions sbom

REGISTRY ?=
# what the index lists; each platform needs an image: this machine's is built by make image, the
# others' are built by make image on a machine of theirs and given as IMAGE_ARCHIVES
PLATFORMS ?= linux/amd64
IMAGE_ARCHIVES ?=
# plain HTTP for a registry on loopback (make registry-test, a node's relay); PLAIN_HTTP=1 for others
PLAIN_HTTP ?= $(if $(filter 127.% localhost localhost:% [::1]%,$(REGISTRY)),1)
ST_CACHE := $(or $(ST_CACHE_DIR),$(HOME)/.cache/safe-termination)
IMAGE_ARCHIVE := $(ST_CACHE)/images/safe-termination-$(VERSION).tar
CHART_VERSION := $(shell sed -n 's/^version: *"\{0,1\}\([^" ]*\)"\{0,1\} *$$/\1/p' charts/safe-termination/Chart.yaml)
HELM := $(ST_CACHE)/k8s-v$(K8S_VERSION)/bin/helm
# the packaged chart and the SBOM
DIST ?= $(CURDIR)/target/dist
need-registry = @test -n "$(REGISTRY)" || { echo "make $@ needs REGISTRY=HOST[:PORT][/PATH], e.g. REGISTRY=127.0.0.1:5000 or REGISTRY=ghcr.io/OWNER" >&2; exit 2; }

registry-test: registry-bins $(if $(ST_OPERATOR_IMAGE),,image) ## image-index and chart-push against a real registry on 127.0.0.1 (image/test_registry.py; make e2e runs it): the index, its manifest, config and layers, helm pull by digest
	ST_OPERATOR_IMAGE="$(or $(ST_OPERATOR_IMAGE),$(IMAGE_ARCHIVE))" python3 -m unittest -v image/test_registry.py

registry-bins: ## build the OCI registry (distribution v3.1.2) and crane (v0.22.1) into ~/.cache/safe-termination/tools (e2e/toolchain/build-registry.sh)
	e2e/toolchain/build-registry.sh

image-index: ## push the image to $(REGISTRY)/safe-termination:$(VERSION) as an index of PLATFORMS (linux/amd64); IMAGE_ARCHIVES: the images (default: make image, this machine's); prints REPOSITORY@sha256:...
	$(need-registry)
	@image/push-index.sh --check --platforms "$(PLATFORMS)" $(IMAGE_ARCHIVES)
	@$(if $(IMAGE_ARCHIVES),:,$(MAKE) --no-print-directory image >&2)
	@image/push-index.sh --repository "$(REGISTRY)/safe-termination" --tag "$(VERSION)" --platforms "$(PLATFORMS)" \
		$(if $(PLAIN_HTTP),--plain-http) $(or $(IMAGE_ARCHIVES),$(IMAGE_ARCHIVE))

image-run: ## start the binary of each image in IMAGE_ARCHIVES (default: make image, this machine's) with --version, and its preStop waiter with --help and install DEST (a 0555 copy that runs): natively, or another architecture's under QEMU user emulation (image/run_binary.py; $$QEMU_AARCH64 or e2e/toolchain/qemu.sh)
	@$(if $(IMAGE_ARCHIVES),:,$(MAKE) --no-print-directory image >&2)
	@python3 image/run_binary.py --version "$(VERSION)" $(or $(IMAGE_ARCHIVES),$(IMAGE_ARCHIVE))

chart-push: ## helm package the chart into $(DIST) and helm push it to oci://$(REGISTRY)/charts (version: Chart.yaml's); prints REPOSITORY@sha256:...
	$(need-registry)
	@ST_BUILD_ONLY=helm e2e/toolchain/build-k8s.sh $(K8S_VERSION) >&2
	@mkdir -p "$(DIST)" && "$(HELM)" package charts/safe-termination -d "$(DIST)" >&2
	@set -o pipefail; out="$$("$(HELM)" push "$(DIST)/safe-termination-$(CHART_VERSION).tgz" "oci://$(REGISTRY)/charts" $(if $(PLAIN_HTTP),--plain-http))" \
		|| { echo "$$out" >&2; exit 1; }; echo "$$out" >&2; \
		d="$$(sed -n 's/^Digest: *//p' <<<"$$out")"; [[ "$$d" == sha256:* ]] || { echo "helm push printed no digest" >&2; exit 1; }; \
		echo "$(REGISTRY)/charts/safe-termination@$$d"

registry-login: ## log in to REGISTRY's host as REGISTRY_USER, the password in $$REGISTRY_PASSWORD (crane auth login: ~/.docker/config.json, which helm reads too)
	$(need-registry)
	@test -n "$(REGISTRY_USER)" && test -n "$$REGISTRY_PASSWORD" || { echo "make registry-login needs REGISTRY_USER=... and the password in the environment variable REGISTRY_PASSWORD" >&2; exit 2; }
	@crane="$$(e2e/toolchain/build-registry.sh crane)" && \
		printf '%s' "$$REGISTRY_PASSWORD" | "$$crane" auth login "$(firstword $(subst /, ,$(REGISTRY)))" -u "$(REGISTRY_USER)" --password-stdin

# the pages' commands that name a version of this project: helm's --version, image.tag=, the
# image archive's file name and the image's tag
DOC_VERSION_PAGES := README.md docs charts/safe-termination/README.md e2e/README.md image/README.md
doc-versions: ## the pages' install commands name Cargo.toml's version (make test and make release-check run it)
	@stale="$$(grep -rnoE -- '(--version |image\.tag=|safe-termination[-:])[0-9]+\.[0-9]+\.[0-9]+' $(DOC_VERSION_PAGES) \
		| grep -vE -- '[-: =]$(subst .,\.,$(VERSION))$$' || true)"; \
		if [ -n "$$stale" ]; then echo "these commands name another version than Cargo.toml's $(VERSION):" >&2; echo "$$stale" >&2; exit 1; fi; \
		echo "doc-versions: every versioned command in $(DOC_VERSION_PAGES) names $(VERSION)"

release-check: doc-versions ## a release tag TAG=vX.Y.Z is Cargo.toml's version, the chart's version and its appVersion; the pages' commands name it
	@app="$$(sed -n 's/^appVersion: *"\{0,1\}\([^" ]*\)"\{0,1\} *$$/\1/p' charts/safe-termination/Chart.yaml)"; \
		[[ "$(TAG)" == "v$(VERSION)" && "$(CHART_VERSION)" == "$(VERSION)" && "$$app" == "$(VERSION)" ]] \
		|| { echo "tag '$(TAG)': Cargo.toml has $(VERSION), Chart.yaml version $(CHART_VERSION) and appVersion $$app; all must be the tag without its v" >&2; exit 1; }; \
		echo "release $(TAG): Cargo.toml, Chart.yaml version and appVersion agree"

# The SBOM: the crates of the binary (the image's only software besides Debian's CA bundle), for
# this machine's musl target (the arm64 binary's crates are the same), build dependencies left out
CYCLONEDX_VERSION := 0.5.9
CYCLONEDX := $(ST_CACHE)/tools/cargo-cyclonedx-$(CYCLONEDX_VERSION)/bin/cargo-cyclonedx
sbom: ## CycloneDX 1.5 JSON SBOM of the operator binary's crates: $(DIST)/safe-termination-$(VERSION).cdx.json (cargo-cyclonedx $(CYCLONEDX_VERSION), installed into ~/.cache/safe-termination/tools); prints its path
	@test -x "$(CYCLONEDX)" || nice -n 10 cargo install --locked --quiet cargo-cyclonedx@$(CYCLONEDX_VERSION) --root "$(ST_CACHE)/tools/cargo-cyclonedx-$(CYCLONEDX_VERSION)" >&2
	@mkdir -p "$(DIST)" && "$(CYCLONEDX)" cyclonedx --manifest-path Cargo.toml --format json --spec-version 1.5 --describe binaries --no-build-deps \
			--target "$$(uname -m)-unknown-linux-musl" -qq \
		&& mv -f safe-termination_bin.cdx.json "$(DIST)/safe-termination-$(VERSION).cdx.json" && rm -f crdgen_bin.cdx.json \
		&& echo "$(DIST)/safe-termination-$(VERSION).cdx.json"
