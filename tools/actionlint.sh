#!/usr/bin/env bash
# Lints the GitHub Actions workflows (.github/workflows/*.yml) with actionlint (`make test` runs
# this): expressions, contexts, permissions, action inputs, and every `run:` script through the
# project's pinned ShellCheck (tools/shellcheck.sh --path), so the verdict is the same on every
# machine. actionlint is built from its pinned Go module (e2e/toolchain/build-actionlint.sh,
# cached in ~/.cache/safe-termination/tools/); pyflakes is off (no Python in the workflows).
# Exit status: actionlint's (1 with findings).
set -euo pipefail
cd "$(dirname "$0")/.."

actionlint="$(e2e/toolchain/build-actionlint.sh)"
shellcheck="$(tools/shellcheck.sh --path)"
mapfile -t workflows < <(git ls-files '.github/workflows/*.yml' '.github/workflows/*.yaml')
if ((${#workflows[@]} == 0)); then
  echo "actionlint: no workflow tracked under .github/workflows" >&2
  exit 1
fi
echo "actionlint $("$actionlint" --version | head -1)"
"$actionlint" -shellcheck "$shellcheck" -pyflakes= "${workflows[@]}"
echo "actionlint: ${#workflows[@]} workflows, no finding"
