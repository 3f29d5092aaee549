#!/usr/bin/env bash
# Build the release tooling's registry side from pinned Go modules (no prebuilt downloads):
#   registry  the reference OCI registry, distribution's cmd/registry (github.com/distribution/distribution/v3),
#             module e2e/toolchain/registry/; make registry-test runs it on 127.0.0.1
#   crane     go-containerregistry's crane (github.com/google/go-containerregistry/cmd/crane),
#             module e2e/toolchain/crane/; make image-index pushes the image index with it
# (helm, which pushes the chart, comes from build-k8s.sh.)
#
#   e2e/toolchain/build-registry.sh               # both (make registry-bins)
#   e2e/toolchain/build-registry.sh crane         # only the ones named
#
# Output: ${ST_CACHE_DIR:-~/.cache/safe-termination}/tools/<name>-<module version>/<name>;
# stdout is one path per tool, in the order asked, logs go to stderr. A rerun with every binary
# present and up to date builds nothing and exits in about a second (e2e/toolchain/go-tool.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GO_TOOL_LOG=build-registry
# shellcheck source=e2e/toolchain/go-tool.sh
. "$HERE/go-tool.sh"

(($#)) || set -- registry crane
for t in "$@"; do
  case "$t" in
    registry)
      # version.version: what `registry --version` and the registry's logs report
      go_tool registry "$HERE/registry" github.com/distribution/distribution/v3/cmd/registry \
        "-s -w -X github.com/distribution/distribution/v3/version.version=@VERSION@" ;;
    crane)
      go_tool crane "$HERE/crane" github.com/google/go-containerregistry/cmd/crane \
        "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=@VERSION@" ;;
    *) go_tool_die "unknown tool '$t' (registry, crane)" ;;
  esac
done
