# shellcheck shell=bash
# Sourced by build-registry.sh and build-actionlint.sh: builds one command from its pinned Go
# module (one module per tool under e2e/toolchain/, as build-k8s.sh does) into
# ${ST_CACHE_DIR:-~/.cache/safe-termination}/tools/<name>-<module version>/<name>.
#
#   go_tool NAME MODDIR PACKAGE LDFLAGS    # builds when missing or stale; prints the binary's path
#
# The stamp next to the binary (.<name>.stamp) hashes what changes the binary: go.mod, go.sum,
# the Go version, the package and the flags; a rerun with an up-to-date stamp builds nothing.
# Logs go to stderr (prefix: $GO_TOOL_LOG, the calling script's name); stdout is only the path.
# One build per tool at a time (flock), so concurrent make targets do not race.

go_tool_log() { printf '[%s %(%H:%M:%S)T] %s\n' "${GO_TOOL_LOG:-go-tool}" -1 "$*" >&2; }
go_tool_die() { go_tool_log "ERROR: $*"; exit 1; }

go_tool() {
  local name=$1 mod=$2 pkg=$3 ldflags=$4
  command -v go >/dev/null || go_tool_die "go not found in PATH (need Go >= the go directive of $mod/go.mod)"
  export GOTOOLCHAIN=local            # never download a toolchain
  export CGO_ENABLED=0
  export GOFLAGS="-mod=readonly -buildvcs=false"
  local modpath version cache dir bin stamp gov t0
  modpath="$(sed -n 's|^import _ "\(.*\)"$|\1|p' "$mod/tools.go")"
  [[ "$pkg" == "$modpath" ]] || go_tool_die "$mod/tools.go imports '$modpath', not $pkg"
  # the module that holds the package: the go.mod requirement whose path prefixes it
  version="$(awk -v p="$pkg" '$1 ~ /^require$/ && NF == 3 && index(p "/", $2 "/") == 1 {print $3}' "$mod/go.mod")"
  [[ -n "$version" ]] || go_tool_die "$mod/go.mod has no single-line require of the module of $pkg"
  cache="${ST_CACHE_DIR:-$HOME/.cache/safe-termination}/tools"
  dir="$cache/$name-${version#v}"
  bin="$dir/$name"
  ldflags="${ldflags//@VERSION@/$version}"
  gov="$(go env GOVERSION)"
  stamp="$( { cat "$mod/go.mod" "$mod/go.sum"; echo "$gov $pkg $ldflags trimpath cgo=$CGO_ENABLED"; } | sha256sum | cut -c1-16)"
  mkdir -p "$dir"
  if [[ ! -x "$bin" || "$(cat "$dir/.$name.stamp" 2>/dev/null)" != "$stamp" ]]; then
    exec {lock}>"$dir/.$name.lock"
    flock "$lock"
    if [[ ! -x "$bin" || "$(cat "$dir/.$name.stamp" 2>/dev/null)" != "$stamp" ]]; then
      go_tool_log "building $name $version ($pkg) in ${mod#"$(dirname "$mod")"/}"
      t0=$SECONDS
      (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$dir/.$name.tmp" "$pkg") >&2 \
        || go_tool_die "go build $pkg failed"
      mv -f "$dir/.$name.tmp" "$bin"
      echo "$stamp" > "$dir/.$name.stamp"
      go_tool_log "built $name in $((SECONDS - t0))s: $bin ($(du -h "$bin" | cut -f1))"
    fi
    exec {lock}>&-
  fi
  printf '%s\n' "$bin"
}
