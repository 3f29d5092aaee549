# syntax=docker/dockerfile:1
# safe-termination operator image: a fully static musl binary on distroless/static, non-root.
#   make docker-image               (docker build -t ghcr.io/safe-termination/safe-termination:$(version) .)
#   docker build --build-arg RUST_VERSION=1.95 -t REGISTRY/safe-termination:TAG .
# Without Docker, `make image` builds the same image (image/build.sh); image/test_image.py
# checks that its config matches this file's final stage (entrypoint, cmd, user, ports, labels,
# the files it copies).
# Two static binaries: the operator, and the preStop waiter (waiter/, its own crate and
# Cargo.lock) that the operator's injected init container copies out of this image
# (`safe-termination-wait install DEST`).
# The binary is built for the builder's own architecture (build on arm64 for an arm64 image,
# or let buildx emulate it: --platform linux/arm64).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# musl-gcc compiles ring's C and assembly for the musl target
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# manifests first: the dependency layer is cached until Cargo.toml/Cargo.lock change
COPY Cargo.toml Cargo.lock ./
# Cargo.toml declares the benches; cargo checks every declared target exists
COPY benches ./benches
RUN mkdir -p src/bin \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/crdgen.rs \
 && touch src/lib.rs \
 && target="$(uname -m)-unknown-linux-musl" \
 && rustup target add "$target" \
 && cargo build --release --locked --target "$target" --bin safe-termination \
 && rm -rf src
# the waiter's manifests likewise: its dependency layer is cached until they change
COPY waiter/Cargo.toml waiter/Cargo.lock ./waiter/
RUN mkdir -p waiter/src \
 && echo 'fn main() {}' > waiter/src/main.rs \
 && cd waiter \
 && cargo build --release --locked --target "$(uname -m)-unknown-linux-musl" \
 && rm -rf src
COPY src ./src
# the checks refuse an image whose binary would need a loader (musl links statically):
# ldd's "=>", and readelf's PT_INTERP, which ldd misses for a dynamic musl binary
RUN target="$(uname -m)-unknown-linux-musl" \
 && touch src/main.rs src/lib.rs \
 && cargo build --release --locked --target "$target" --bin safe-termination \
 && cp "target/$target/release/safe-termination" /safe-termination \
 && ! ldd /safe-termination 2>/dev/null | grep -q '=>' \
 && ! readelf -lW /safe-termination | grep -q 'program interpreter'
COPY waiter/src ./waiter/src
RUN target="$(uname -m)-unknown-linux-musl" \
 && cd waiter \
 && touch src/main.rs \
 && cargo build --release --locked --target "$target" \
 && cp "target/$target/release/safe-termination-wait" /safe-termination-wait \
 && ! readelf -lW /safe-termination-wait | grep -q 'program interpreter' \
 && /safe-termination-wait --help | grep -q 'safe-termination-wait install DEST'

FROM gcr.io/distroless/static-debian12:nonroot
# the version is Cargo.toml's (and the chart's appVersion); the license Cargo.toml's
LABEL org.opencontainers.image.title="safe-termination" \
      org.opencontainers.image.description="Kubernetes operator that measures kube-proxy's propagation window and sizes preStop sleeps and terminationGracePeriodSeconds from it" \
      org.opencontainers.image.source="https://github.com/safe-termination/safe-termination" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.2.0"
COPY --from=build /safe-termination /usr/local/bin/safe-termination
# the preStop waiter; the injected init container runs
# ["/usr/local/bin/safe-termination-wait", "install", "/safe-termination/bin/safe-termination-wait"]
COPY --from=build /safe-termination-wait /usr/local/bin/safe-termination-wait
# distroless "nonroot": uid/gid 65532 (the chart's runAsUser/runAsGroup)
USER 65532:65532
# webhook (HTTPS) and admin (/livez, /readyz, /metrics)
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/safe-termination"]
CMD ["run"]
