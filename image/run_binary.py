#!/usr/bin/env python3
"""Start the operator binary of each image archive and check the version it prints (stdlib only).

    python3 image/run_binary.py --version V [--path /usr/local/bin/safe-termination] ARCHIVE...

`make image-run` runs it on the archives of a release (the release workflow: the amd64 and the
arm64 image, before they are pushed as one index). For each OCI image-layout tar (one image,
checked blob by blob as image/oci_index.py reads it):

1. the file at --path is taken from the image's layers (oci_index.Archive.layer_file: the last
   layer holding it wins; a whiteout or a missing file is an error);
2. its ELF header must be the architecture the image config names (e_machine 62 for amd64,
   183 for arm64): an arm64 image carrying an x86_64 binary is an error, not a pass;
3. it runs with `--version`: natively when it is this machine's architecture, otherwise under
   QEMU's user-mode emulator ($QEMU_AARCH64, else e2e/toolchain/qemu.sh: Debian 12's
   qemu-user-static; called by its path, no binfmt_misc registration), with a 60 s bound;
4. its first line of stdout must be `safe-termination V` (`make image-run` gives Cargo.toml's
   version as --version).

Prints one line per archive, `ARCHIVE: linux/arm64 (aarch64 ELF, under qemu-aarch64-static):
safe-termination 0.2.0`. Exit 0 when every archive passed, 1 when one did not (each failure
named on stderr), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

from elf_interp import machine
from oci_index import Archive, UsageError, platform_str

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QEMU = os.path.join(ROOT, "e2e", "toolchain", "qemu.sh")
DEFAULT_PATH = "/usr/local/bin/safe-termination"
RUN_TIMEOUT_SECONDS = 60

# OCI architecture -> (ELF e_machine, uname -m, QEMU's name for it); ELF gABI machine numbers
ARCHES = {
    "amd64": (62, "x86_64", "x86_64"),
    "arm64": (183, "aarch64", "aarch64"),
}
MACHINE_NAMES = {machine: uname for machine, uname, _ in ARCHES.values()}


class Failure(Exception):
    """What was wrong with one archive; the message names it."""


def elf_machine(data: bytes, what: str) -> int:
    """e_machine of the binary (elf_interp.machine); a file that is not a 64-bit ELF is a Failure."""
    try:
        return machine(data, what)
    except ValueError as e:
        raise Failure(str(e)) from None


def emulator(qemu_arch: str) -> str:
    """The path of qemu-ARCH-static: $QEMU_<ARCH> when set (QEMU_AARCH64=/usr/bin/qemu-aarch64-static
    on a runner that installed its distribution's package), else e2e/toolchain/qemu.sh's (Debian
    12's, unpacked on a cache miss)."""
    given = os.environ.get(f"QEMU_{qemu_arch.upper()}")
    if given:
        if not os.access(given, os.X_OK):
            raise Failure(f"QEMU_{qemu_arch.upper()}={given} is not an executable file")
        return given
    out = subprocess.run([QEMU, qemu_arch], capture_output=True, text=True)
    if out.returncode != 0:
        raise Failure(f"e2e/toolchain/qemu.sh {qemu_arch} failed: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1]


def run_one(archive_path: str, path: str, version: str) -> str:
    archive = Archive(archive_path)
    plat = platform_str(archive.platform)
    if archive.platform["os"] != "linux" or archive.platform["architecture"] not in ARCHES:
        raise Failure(f"{archive_path}: {plat} is not one this check knows (linux/amd64, linux/arm64)")
    want_machine, uname, qemu_arch = ARCHES[archive.platform["architecture"]]
    binary = archive.layer_file(path)
    if binary is None:
        raise Failure(f"{archive_path}: the image has no {path}")
    machine = elf_machine(binary, f"{archive_path}: {path}")
    if machine != want_machine:
        got = MACHINE_NAMES.get(machine, f"e_machine {machine}")
        raise Failure(f"{archive_path}: the image config says {plat}, but {path} is an ELF binary for {got}, not {uname}")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, os.path.basename(path))
        with open(exe, "wb") as f:
            f.write(binary)
        os.chmod(exe, 0o755)
        if uname == platform.machine():
            argv, how = [exe, "--version"], "natively"
        else:
            qemu = emulator(qemu_arch)
            argv, how = [qemu, exe, "--version"], f"under {os.path.basename(qemu)}"
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise Failure(f"{archive_path}: {path} --version ran {how} for over {RUN_TIMEOUT_SECONDS} s") from None
    first = (out.stdout.splitlines() or [""])[0].strip()
    if out.returncode != 0:
        raise Failure(f"{archive_path}: {path} --version {how} exited {out.returncode}: {out.stderr.strip()[:500]}")
    if first != f"safe-termination {version}":
        raise Failure(f"{archive_path}: {path} --version {how} printed {first!r}, not 'safe-termination {version}'")
    return f"{archive_path}: {plat} ({uname} ELF, {how}): {first}"


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def main(argv: list[str]) -> int:
    parser = Parser(prog="run_binary.py", description="start each image's binary with --version")
    parser.add_argument("--path", default=DEFAULT_PATH, help=f"the binary in the image (default {DEFAULT_PATH})")
    parser.add_argument("--version", required=True, help="the version it must print (make image-run gives Cargo.toml's)")
    parser.add_argument("archives", nargs="+", metavar="ARCHIVE")
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"run_binary.py: error: {e}", file=sys.stderr)
        return 2
    failed = 0
    for path in args.archives:
        try:
            print(run_one(path, args.path, args.version), flush=True)
        except (Failure, UsageError) as e:
            print(f"run_binary.py: FAILED: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
