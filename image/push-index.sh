#!/usr/bin/env bash
# Push the operator image to a registry as a multi-platform image INDEX (`make image-index`):
# the single-platform OCI archives `make image` writes (image/build.sh) are joined into one
# index with a linux/<arch> manifest each (image/oci_index.py), which crane pushes with every
# blob (crane from e2e/toolchain/build-registry.sh, or $CRANE).
#
#   image/push-index.sh --repository REGISTRY/safe-termination --tag 0.2.0 \
#       [--platforms "linux/amd64 linux/arm64"] [--plain-http] ARCHIVE...
#   image/push-index.sh --check [--platforms "..."] [ARCHIVE...]
#
# --platforms (default: this machine's) is what the index lists, in that order; every one needs
# an archive. --check only checks that (no archive: the one `make image` builds here, of this
# machine's platform), so make image-index fails before a long build. A platform of another
# architecture cannot be built here: its image is built by `make image` on a machine of that
# architecture (as the release workflow does on an arm64 runner) and passed as an ARCHIVE; the
# error says what is missing (for arm64 on x86_64: Rust's std for aarch64-unknown-linux-musl).
# --plain-http: the registry speaks HTTP (crane --insecure), e.g. 127.0.0.1:5000.
#
# Logs go to stderr; the last line on stdout is the pushed index as REPOSITORY@sha256:..., the
# reference to pull by digest. The tag points at the index too. The same archives give the same
# index digest (oci_index.py is deterministic).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

log() { printf '[push-index %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

check=0 repository="" tag="" platforms="" plain_http=0 archives=()
while (($#)); do
  case "$1" in
    --check) check=1 ;;
    --repository) repository="${2:?--repository needs a value}"; shift ;;
    --tag) tag="${2:?--tag needs a value}"; shift ;;
    --platforms) platforms="${2?--platforms needs a value}"; shift ;;
    --plain-http) plain_http=1 ;;
    --*) die "unknown option $1" ;;
    *) archives+=("$1") ;;
  esac
  shift
done

rust_target() {   # OS/ARCH -> the Rust target of its static binary (as make static builds it)
  case "$1" in
    linux/amd64) echo x86_64-unknown-linux-musl ;;
    linux/arm64 | linux/arm64/v8) echo aarch64-unknown-linux-musl ;;
    *) return 1 ;;
  esac
}
case "$(uname -m)" in
  x86_64) native=linux/amd64 ;;
  aarch64) native=linux/arm64 ;;
  *) native="" ;;
esac
platforms="${platforms:-$native}"
[[ -n "$platforms" ]] || die "no --platforms and no OCI platform known for this machine ($(uname -m))"

# Why this machine has no image of PLATFORM, and what to do about it.
cannot_build() {
  local p=$1 target sysroot have
  if [[ "$p" == "$native" ]]; then
    echo "$p: no archive of it among the ones given (make image-index without IMAGE_ARCHIVES builds it here with make image)"
    return
  fi
  if ! target="$(rust_target "$p")"; then
    echo "$p: no Rust target is known for it (linux/amd64 and linux/arm64 are)"
    return
  fi
  sysroot="$(rustc --print sysroot 2>/dev/null || true)"
  if [[ -z "$sysroot" ]] || ! compgen -G "$sysroot/lib/rustlib/$target/lib/libstd-*.rlib" >/dev/null; then
    have="$(cd "$sysroot/lib/rustlib" 2>/dev/null && for d in */lib; do [[ -d "$d" ]] && printf '%s\n' "${d%/lib}"; done | paste -sd ' ')"
    echo "$p: this machine ($(uname -m)) cannot build its image: Rust's std for $target is not installed (the toolchain${sysroot:+ at $sysroot} has the std of: ${have:-nothing}); \`rustup target add $target\` would install it where toolchain downloads are allowed, and ring and mimalloc would still need a C compiler for $target"
  else
    echo "$p: Rust's std for $target is installed, but cross-building the image is not wired (ring and mimalloc compile C: that needs a C compiler for $target)"
  fi
  echo "  build that image on a $p machine instead (make image there: the release workflow does so on an arm64 runner) and pass every archive: IMAGE_ARCHIVES=\"AMD64.tar ARM64.tar\""
}

# ------------------------------------------------------------------ which platforms have an archive
have=()
if ((${#archives[@]})); then
  for a in "${archives[@]}"; do
    [[ -f "$a" ]] || die "no archive at $a"
    have+=("$(python3 "$HERE/oci_index.py" platform "$a")") || die "$a: not an OCI image archive"
  done
elif ((check)); then
  [[ -n "$native" ]] && have=("$native")
else
  die "no ARCHIVE given"
fi
missing=()
for p in $platforms; do
  [[ " ${have[*]} " == *" $p "* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  log "ERROR: the index is to list $platforms; there is no image of ${missing[*]}:"
  for p in "${missing[@]}"; do cannot_build "$p" | sed 's/^/  /' >&2; done
  exit 1
fi
if ((check)); then
  log "every platform of the index has an image: $platforms"
  exit 0
fi

# ------------------------------------------------------------------ write the layout, push it
[[ -n "$repository" && -n "$tag" ]] || die "--repository and --tag are required"
crane="${CRANE:-}"
[[ -n "$crane" ]] || crane="$("$ROOT/e2e/toolchain/build-registry.sh" crane)"
tmp="$(mktemp -d /tmp/st-push-index.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
digest="$(python3 "$HERE/oci_index.py" layout --out "$tmp/layout" --tag "$tag" --platforms "$platforms" "${archives[@]}")" \
  || die "cannot join the archives into an index"
flags=()
((plain_http)) && flags+=(--insecure)
log "pushing $repository:$tag (index $digest: $platforms)"
pushed="$("$crane" "${flags[@]}" push "$tmp/layout" "$repository:$tag")" || die "crane push failed"
[[ "$pushed" == "$repository@$digest" ]] || die "crane pushed $pushed, not the index $digest"
# read it back: the registry serves the index under its digest
"$crane" "${flags[@]}" manifest "$repository@$digest" >"$tmp/served" || die "the registry does not serve $repository@$digest"
[[ "sha256:$(sha256sum <"$tmp/served" | cut -d' ' -f1)" == "$digest" ]] || die "the registry serves other bytes for $repository@$digest"
log "pushed $repository:$tag = $repository@$digest"
printf '%s\n' "$repository@$digest"
