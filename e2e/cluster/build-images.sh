#!/usr/bin/env bash
# Build the e2e test workload images (no registry, no Docker): the static
# st-testapp binary (e2e/testapp, musl) and the preStop waiter (waiter/, musl) packed by
# image/oci_image.py into three OCI image-layout tarballs for `ctr -n k8s.io images import`.
#
#   e2e/cluster/build-images.sh        # prints the three tarball paths on stdout, logs on stderr
#
# Output, in ${ST_CACHE_DIR:-~/.cache/safe-termination}/images/:
#   st-pause.tar    image st.local/pause:1    entrypoint /st-testapp pause, user 65535
#   st-testapp.tar  image st.local/testapp:1  entrypoint /st-testapp serve, user 65532:65532, 8080/tcp
#   st-waiter.tar   image st.local/waiter:1   /usr/local/bin/safe-termination-wait, user 65532:65532
#                   (the init container of Wait policies' pods: the operator's --wait-image in the tests)
#   st-testapp      the binary itself (the load generator runs it on the nodes, outside containers)
#   st-testapp.sha256, .stamp
#
# Pod specs (and containerd's sandbox image setting) use the names verbatim:
# `image: st.local/testapp:1` with `imagePullPolicy: Never`; they are already
# normalised (st.local is a registry host), so the name ctr import stores is the
# name the kubelet asks for (see image/oci_image.py).
#
# A rerun reuses the tarballs when the binary's sha256, image/oci_image.py and the
# image parameters are unchanged (the .stamp file); cargo itself rebuilds only
# when e2e/testapp changed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}"
IMAGES="$CACHE_ROOT/images"
TARGET=x86_64-unknown-linux-musl
CRATE="$HERE/../testapp"
# cargo writes to $CARGO_TARGET_DIR when it is set (a relative one from the current directory,
# where cargo runs below), else to the crate's own target/
case "${CARGO_TARGET_DIR:-}" in
  "") TARGET_ROOT="$CRATE/target" ;;
  /*) TARGET_ROOT="$CARGO_TARGET_DIR" ;;
  *) TARGET_ROOT="$PWD/$CARGO_TARGET_DIR" ;;
esac
BUILT="$TARGET_ROOT/$TARGET/release/st-testapp"

PAUSE_NAME=st.local/pause:1
TESTAPP_NAME=st.local/testapp:1
WAITER_NAME=st.local/waiter:1

log() { printf '[build-images %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust via rustup)"
command -v python3 >/dev/null 2>&1 || die "python3 not found"
mkdir -p "$IMAGES"

# One build at a time (several node set-ups may call this concurrently).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$IMAGES/.lock"
  flock 9
fi

# ------------------------------------------------------------------ binary
if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed | grep -x "$TARGET" >/dev/null; then
    log "installing the Rust target $TARGET"
    rustup target add "$TARGET" >&2
  fi
fi
log "cargo build --release --target $TARGET (e2e/testapp)"
cargo build --quiet --release --locked --target "$TARGET" --manifest-path "$CRATE/Cargo.toml" >&2
[[ -x "$BUILT" ]] || die "cargo did not produce $BUILT"
if command -v ldd >/dev/null 2>&1; then
  # glibc's ldd says "not a dynamic executable", musl's "statically linked"
  ldd_out="$(ldd "$BUILT" 2>&1 || true)"
  grep -qE 'not a dynamic executable|statically linked' <<<"$ldd_out" \
    || die "$BUILT is dynamically linked: $ldd_out"
fi

# the preStop waiter (waiter/), for the init container of Wait policies' pods
# (st.local/waiter:1, the operator's --wait-image in the e2e tests and the experiment)
WAITER_CRATE="$HERE/../../waiter"
case "${CARGO_TARGET_DIR:-}" in
  "") WAITER_BUILT="$WAITER_CRATE/target/$TARGET/release/safe-termination-wait" ;;
  *) WAITER_BUILT="$TARGET_ROOT/$TARGET/release/safe-termination-wait" ;;
esac
log "cargo build --release --target $TARGET (waiter)"
cargo build --quiet --release --locked --target "$TARGET" --manifest-path "$WAITER_CRATE/Cargo.toml" >&2
[[ -x "$WAITER_BUILT" ]] || die "cargo did not produce $WAITER_BUILT"
waiter_sha="$(sha256sum "$WAITER_BUILT" | cut -d' ' -f1)"

bin_sha="$(sha256sum "$BUILT" | cut -d' ' -f1)"
if [[ ! -x "$IMAGES/st-testapp" ]] || [[ "$(cat "$IMAGES/st-testapp.sha256" 2>/dev/null)" != "$bin_sha" ]]; then
  install -m 0755 "$BUILT" "$IMAGES/st-testapp.tmp.$$"
  mv -f "$IMAGES/st-testapp.tmp.$$" "$IMAGES/st-testapp"
  printf '%s\n' "$bin_sha" >"$IMAGES/st-testapp.sha256"
fi

# ------------------------------------------------------------------ images
PASSWD='root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\nnobody:x:65535:65535:nobody:/:/sbin/nologin\n'
GROUP='root:x:0:\nnonroot:x:65532:\nnobody:x:65535:\n'
common=(
  --add "$BUILT:/st-testapp:0755"
  --add-dir-empty /tmp:1777
  --add-text "/etc/passwd:$PASSWD"
  --add-text "/etc/group:$GROUP"
  --label org.opencontainers.image.source=safe-termination/e2e/testapp
  --label "st.testapp.sha256=$bin_sha"
)
pause_args=(--name "$PAUSE_NAME" "${common[@]}" --entrypoint '["/st-testapp","pause"]' --user 65535)
testapp_args=(--name "$TESTAPP_NAME" "${common[@]}" --entrypoint '["/st-testapp","serve"]' --user 65532:65532
  --expose 8080/tcp --workdir /)
waiter_args=(--name "$WAITER_NAME" --add "$WAITER_BUILT:/usr/local/bin/safe-termination-wait:0755"
  --add-text "/etc/passwd:$PASSWD" --add-text "/etc/group:$GROUP" --label "st.waiter.sha256=$waiter_sha"
  --entrypoint '["/usr/local/bin/safe-termination-wait"]' --user 65532:65532)

stamp="$(
  {
    printf 'bin %s\n' "$bin_sha"
    printf 'writer %s\n' "$(sha256sum "$HERE/../../image/oci_image.py" | cut -d' ' -f1)"
    printf 'pause %s\n' "${pause_args[*]}"
    printf 'testapp %s\n' "${testapp_args[*]}"
    printf 'waiter %s\n' "${waiter_args[*]}"
  } | sha256sum | cut -d' ' -f1
)"
if [[ -s "$IMAGES/st-pause.tar" && -s "$IMAGES/st-testapp.tar" && -s "$IMAGES/st-waiter.tar" && "$(cat "$IMAGES/.stamp" 2>/dev/null)" == "$stamp" ]]; then
  log "images up to date (st-testapp sha256 $bin_sha)"
else
  rm -f "$IMAGES/.stamp"
  python3 "$HERE/../../image/oci_image.py" --out "$IMAGES/st-pause.tar" "${pause_args[@]}" >&2
  python3 "$HERE/../../image/oci_image.py" --out "$IMAGES/st-testapp.tar" "${testapp_args[@]}" >&2
  python3 "$HERE/../../image/oci_image.py" --out "$IMAGES/st-waiter.tar" "${waiter_args[@]}" >&2
  printf '%s\n' "$stamp" >"$IMAGES/.stamp"
  log "wrote $PAUSE_NAME, $TESTAPP_NAME and $WAITER_NAME (st-testapp sha256 $bin_sha, waiter $waiter_sha)"
fi

printf '%s\n' "$IMAGES/st-pause.tar" "$IMAGES/st-testapp.tar" "$IMAGES/st-waiter.tar"
