#!/usr/bin/env bash
# Build actionlint (github.com/rhysd/actionlint/cmd/actionlint) from its pinned Go module
# (e2e/toolchain/actionlint/) for `make test`'s lint of .github/workflows (tools/actionlint.sh).
#
#   e2e/toolchain/build-actionlint.sh     # prints the binary's path on stdout, logs on stderr
#
# Output: ${ST_CACHE_DIR:-~/.cache/safe-termination}/tools/actionlint-<version>/actionlint; a
# rerun with the binary up to date builds nothing (e2e/toolchain/go-tool.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GO_TOOL_LOG=build-actionlint
# shellcheck source=e2e/toolchain/go-tool.sh
. "$HERE/go-tool.sh"

go_tool actionlint "$HERE/actionlint" github.com/rhysd/actionlint/cmd/actionlint \
  "-s -w -X github.com/rhysd/actionlint.version=@VERSION@"
