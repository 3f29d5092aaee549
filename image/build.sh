#!/usr/bin/env bash
# Build the operator image without Docker and without a registry: the two static musl binaries
# (`make static`: the operator, and the preStop waiter of the separate crate waiter/) and what
# they need from distroless/static-debian12:nonroot, packed by
# image/oci_image.py (`--chown` for the one directory not owned by root) into an
# OCI image-layout tarball. `make image` runs `make static`, then this.
#
#   image/build.sh     # logs on stderr; the last line on stdout is the archive's absolute path
#
# Output: ${ST_CACHE_DIR:-~/.cache/safe-termination}/images/safe-termination-VERSION.tar, image
# ghcr.io/safe-termination/safe-termination:VERSION (VERSION: Cargo.toml's, the chart's
# appVersion), so a node that imported it (`ctr -n k8s.io images import FILE`) runs the chart's
# default image without a pull. Also there: ca-certificates.crt (the bundle packed) and
# safe-termination-VERSION.stamp.
#
# The image, as the Dockerfile's final stage describes it (image/test_image.py checks the two
# agree): /usr/local/bin/safe-termination (0755, root), the waiter
# /usr/local/bin/safe-termination-wait (0755, root; the operator's injected init container runs
# `safe-termination-wait install /safe-termination/bin/safe-termination-wait` from this image),
# USER 65532:65532, EXPOSE 8443 8080,
# ENTRYPOINT ["/usr/local/bin/safe-termination"], CMD ["run"], the Dockerfile's OCI labels; and
# from distroless/static:nonroot: /etc/passwd, /etc/group, /etc/nsswitch.conf, the CA bundle
# /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates, as distroless builds it: the
# package's certificates concatenated), /home/nonroot (0700, 65532), /root (0700), /tmp (1777),
# Env PATH and SSL_CERT_FILE, WorkingDir /home/nonroot.
#
# The binaries are found where `make static` builds them: $CARGO_TARGET_DIR (default target/)
# for the operator; for the waiter, built from waiter/, waiter/target, or $CARGO_TARGET_DIR
# when absolute, else waiter/$CARGO_TARGET_DIR.
#
# Deterministic (same inputs, same bytes and digest). A rerun reuses the archive when the
# two binaries, the CA bundle, the writer and the parameters are unchanged (the .stamp file).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE_ROOT="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}"
IMAGES="$CACHE_ROOT/images"
REPOSITORY=ghcr.io/safe-termination/safe-termination
WRITER="$HERE/oci_image.py"
CA_SOURCES=/usr/share/ca-certificates/mozilla
CA_COPYRIGHT=/usr/share/doc/ca-certificates/copyright

log() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v python3 >/dev/null 2>&1 || die "python3 not found"
cd "$ROOT"

# ------------------------------------------------------------------ Cargo.toml's package
pkg_field() { sed -n "s/^$1 = \"\(.*\)\"\$/\1/p" Cargo.toml | head -1; }
NAME="$(pkg_field name)"
VERSION="$(pkg_field version)"
DESCRIPTION="$(pkg_field description)"
LICENSE="$(pkg_field license)"
[[ -n "$NAME" && -n "$VERSION" && -n "$DESCRIPTION" && -n "$LICENSE" ]] \
  || die "cannot read name, version, description and license from Cargo.toml"
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/safe-termination/Chart.yaml)"
[[ "$app_version" == "$VERSION" ]] \
  || log "WARNING: Cargo.toml's version $VERSION is not the chart's appVersion '$app_version': the chart's default image is not this one"
IMAGE_NAME="$REPOSITORY:$VERSION"
OUT="$IMAGES/safe-termination-$VERSION.tar"
STAMP="$IMAGES/safe-termination-$VERSION.stamp"

# ------------------------------------------------------------------ binaries
ARCH="$(uname -m)"
case "$ARCH" in
  x86_64) PLATFORM=linux/amd64 ;;
  aarch64) PLATFORM=linux/arm64 ;;
  *) die "no OCI platform known for $ARCH (x86_64 and aarch64 are)" ;;
esac
# the operator: cargo runs in the repository's root
target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" == /* ]] || target_dir="$ROOT/$target_dir"
BIN="$target_dir/$ARCH-unknown-linux-musl/release/safe-termination"
# the waiter: cargo runs in waiter/ (as in the Makefile's static recipe), so a relative
# CARGO_TARGET_DIR is under waiter/
case "${CARGO_TARGET_DIR:-}" in
  "") wait_target_dir="$ROOT/waiter/target" ;;
  /*) wait_target_dir="$CARGO_TARGET_DIR" ;;
  *) wait_target_dir="$ROOT/waiter/$CARGO_TARGET_DIR" ;;
esac
WAIT_BIN="$wait_target_dir/$ARCH-unknown-linux-musl/release/safe-termination-wait"

check_static() {   # BINARY: an executable ELF file that asks for no loader
  local bin="$1" interp
  [[ -f "$bin" ]] || die "no static binary at $bin: run 'make static' (or 'make image', which does)"
  [[ -x "$bin" ]] || die "$bin is not executable"
  [[ "$(head -c 4 "$bin")" == $'\x7fELF' ]] || die "$bin is not an ELF executable"
  # a static binary has no ELF interpreter (PT_INTERP): distroless/static has no loader and no
  # shared library. (ldd cannot tell: glibc's ldd prints no "=>" for a dynamic musl binary, as
  # RUSTFLAGS=-C target-feature=-crt-static builds it.)
  interp="$(python3 "$HERE/elf_interp.py" "$bin")" || die "$bin: cannot read its ELF header"
  [[ -z "$interp" ]] || die "$bin is dynamically linked (it asks for the loader $interp): build it with 'make static'"
}
check_static "$BIN"
check_static "$WAIT_BIN"

# ------------------------------------------------------------------ CA certificates
if ! compgen -G "$CA_SOURCES/*.crt" >/dev/null; then
  command -v apt-get >/dev/null 2>&1 || die "no CA certificates in $CA_SOURCES and no apt-get to install ca-certificates"
  log "installing the Debian package ca-certificates"
  sudo=""
  [[ "$(id -u)" -eq 0 ]] || sudo=sudo
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then   # never updated
    $sudo apt-get update -qq >&2
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends ca-certificates >&2 \
    || { $sudo apt-get update -qq >&2 \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends ca-certificates >&2; }
  compgen -G "$CA_SOURCES/*.crt" >/dev/null || die "ca-certificates installed, but $CA_SOURCES has no .crt file"
fi

mkdir -p "$IMAGES"
# One build at a time (make image and the cluster scripts may run concurrently).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$IMAGES/.safe-termination.lock"
  flock 9
fi

# The bundle as distroless builds it: the package's certificates (not the host's
# /etc/ssl/certs, which may hold local additions), concatenated in name order.
CA_BUNDLE="$IMAGES/ca-certificates.crt"
(
  export LC_ALL=C
  for crt in "$CA_SOURCES"/*.crt; do
    cat "$crt"
    [[ -z "$(tail -c 1 "$crt")" ]] || echo
  done
) >"$CA_BUNDLE.tmp.$$"
mv -f "$CA_BUNDLE.tmp.$$" "$CA_BUNDLE"
grep -q 'BEGIN CERTIFICATE' "$CA_BUNDLE" || die "$CA_BUNDLE holds no certificate"

# ------------------------------------------------------------------ image
PASSWD='root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n'
GROUP='root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n'
NSSWITCH='passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n'
args=(
  --name "$IMAGE_NAME"
  --platform "$PLATFORM"
  --add "$BIN:/usr/local/bin/safe-termination:0755"
  --add "$WAIT_BIN:/usr/local/bin/safe-termination-wait:0755"
  --add "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:0644"
  --add-text "/etc/passwd:$PASSWD"
  --add-text "/etc/group:$GROUP"
  --add-text "/etc/nsswitch.conf:$NSSWITCH"
  --add-dir-empty /home/nonroot:0700
  --chown /home/nonroot:65532:65532
  --add-dir-empty /root:0700
  --add-dir-empty /tmp:1777
  --user 65532:65532
  --expose 8443/tcp
  --expose 8080/tcp
  --entrypoint '["/usr/local/bin/safe-termination"]'
  --cmd '["run"]'
  --workdir /home/nonroot
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  --label "org.opencontainers.image.title=$NAME"
  --label "org.opencontainers.image.description=$DESCRIPTION"
  --label "org.opencontainers.image.source=https://github.com/safe-termination/safe-termination"
  --label "org.opencontainers.image.licenses=$LICENSE"
  --label "org.opencontainers.image.version=$VERSION"
)
if [[ -f "$CA_COPYRIGHT" ]]; then   # the certificates' licence notice, as distroless ships it
  args+=(--add "$CA_COPYRIGHT:$CA_COPYRIGHT:0644")
fi

bin_sha="$(sha256sum "$BIN" | cut -d' ' -f1)"
wait_sha="$(sha256sum "$WAIT_BIN" | cut -d' ' -f1)"
stamp="$(
  {
    printf 'bin %s\n' "$bin_sha"
    printf 'wait %s\n' "$wait_sha"
    sha256sum "$CA_BUNDLE" "$WRITER" | cut -d' ' -f1
    [[ ! -f "$CA_COPYRIGHT" ]] || sha256sum "$CA_COPYRIGHT" | cut -d' ' -f1
    printf 'args %s\n' "${args[*]}"
  } | sha256sum | cut -d' ' -f1
)"
if [[ -s "$OUT" && "$(cat "$STAMP" 2>/dev/null)" == "$stamp" ]]; then
  log "image up to date: $IMAGE_NAME (safe-termination sha256 $bin_sha, safe-termination-wait sha256 $wait_sha)"
else
  rm -f "$STAMP"
  log "packing $IMAGE_NAME ($PLATFORM, safe-termination sha256 $bin_sha, safe-termination-wait sha256 $wait_sha, $(stat -c %s "$WAIT_BIN") bytes)"
  python3 "$WRITER" --out "$OUT" "${args[@]}" >&2 || die "packing $IMAGE_NAME failed"
  printf '%s\n' "$stamp" >"$STAMP"
fi
digest="$(tar -xOf "$OUT" index.json | python3 -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')"
log "$IMAGE_NAME: manifest $digest, $(du -h "$OUT" | cut -f1) archive"
printf '%s\n' "$OUT"
