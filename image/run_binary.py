#!/usr/bin/env python3
"""Start the operator binary and the preStop waiter of each image archive and check what they
print (stdlib only).

    python3 image/run_binary.py --version V [--path /usr/local/bin/safe-termination]
                                [--wait-path /usr/local/bin/safe-termination-wait] ARCHIVE...

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
   version as --version);
5. the waiter at --wait-path (the operator's injected init container runs
   `safe-termination-wait install /safe-termination/bin/safe-termination-wait` from the image)
   is taken and checked the same way (present, the config's architecture), then run as in 3:
   `--help` must exit 0 with the usage (`usage:` first, naming `safe-termination-wait install
   DEST`) on stdout; `install DIR/safe-termination-wait` into a new temporary directory must exit
   0 and leave exactly that file there, mode 0555, the same bytes as the image's; that copy,
   run with `--help`, must print the same usage.

Prints one line per archive, `ARCHIVE: linux/arm64 (aarch64 ELF, under qemu-aarch64-static):
safe-termination 0.2.0; /usr/local/bin/safe-termination-wait: --help, install (0555, runs)`.
Exit 0 when every archive passed, 1 when one did not (each failure named on stderr), 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import os
import platform
import stat
import subprocess
import sys
import tempfile

from elf_interp import machine
from oci_index import Archive, UsageError, platform_str

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QEMU = os.path.join(ROOT, "e2e", "toolchain", "qemu.sh")
DEFAULT_PATH = "/usr/local/bin/safe-termination"
DEFAULT_WAIT_PATH = "/usr/local/bin/safe-termination-wait"
# what the waiter's usage (`--help`) must name
WAIT_USAGE = "safe-termination-wait install DEST"
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


class Runner:
    """Runs programs of one image's architecture: natively, or under QEMU's user-mode emulator."""

    def __init__(self, archive_path: str, uname: str, qemu_arch: str) -> None:
        self.archive_path = archive_path
        if uname == platform.machine():
            self.prefix, self.how = [], "natively"
        else:
            qemu = emulator(qemu_arch)
            self.prefix, self.how = [qemu], f"under {os.path.basename(qemu)}"

    def run(self, exe: str, *args: str, what: str) -> subprocess.CompletedProcess:
        """`exe args...` with RUN_TIMEOUT_SECONDS; `what` names it in a Failure (the image's path
        and arguments). A non-zero exit status is a Failure too."""
        try:
            out = subprocess.run([*self.prefix, exe, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise Failure(f"{self.archive_path}: {what} ran {self.how} for over {RUN_TIMEOUT_SECONDS} s") from None
        if out.returncode != 0:
            raise Failure(f"{self.archive_path}: {what} {self.how} exited {out.returncode}: {out.stderr.strip()[:500]}")
        return out


def image_binary(archive: Archive, archive_path: str, path: str, plat: str, want_machine: int, uname: str, into: str) -> tuple[str, bytes]:
    """The file at `path` in the image, written to the directory `into` (mode 0755); it must be
    an ELF binary of the image config's architecture. Returns its path there and its bytes."""
    binary = archive.layer_file(path)
    if binary is None:
        raise Failure(f"{archive_path}: the image has no {path}")
    machine = elf_machine(binary, f"{archive_path}: {path}")
    if machine != want_machine:
        got = MACHINE_NAMES.get(machine, f"e_machine {machine}")
        raise Failure(f"{archive_path}: the image config says {plat}, but {path} is an ELF binary for {got}, not {uname}")
    os.makedirs(into, exist_ok=True)
    exe = os.path.join(into, os.path.basename(path))
    with open(exe, "wb") as f:
        f.write(binary)
    os.chmod(exe, 0o755)
    return exe, binary


def check_usage(archive_path: str, what: str, out: subprocess.CompletedProcess) -> str:
    """The waiter's `--help` output: `usage:` first, naming WAIT_USAGE."""
    lines = out.stdout.splitlines()
    if not lines or lines[0].strip() != "usage:" or WAIT_USAGE not in out.stdout:
        raise Failure(f"{archive_path}: {what} printed {out.stdout.strip()[:200]!r}, not a usage naming {WAIT_USAGE!r}")
    return out.stdout


def check_waiter(archive: Archive, archive_path: str, wait_path: str, plat: str, want_machine: int, uname: str,
                 runner: Runner, tmp: str) -> str:
    """--help, then install into a new directory, as the operator's init container does; the
    copy (0555, the image's bytes, alone in the directory) runs --help too. Returns the report."""
    exe, binary = image_binary(archive, archive_path, wait_path, plat, want_machine, uname, os.path.join(tmp, "waiter"))
    usage = check_usage(archive_path, f"{wait_path} --help", runner.run(exe, "--help", what=f"{wait_path} --help"))
    dest_dir = os.path.join(tmp, "emptydir")
    os.mkdir(dest_dir)
    name = os.path.basename(wait_path)
    dest = os.path.join(dest_dir, name)
    runner.run(exe, "install", dest, what=f"{wait_path} install DEST")
    left = sorted(os.listdir(dest_dir))
    if left != [name]:
        raise Failure(f"{archive_path}: {wait_path} install DEST left {left} in DEST's directory, not [{name!r}]")
    st = os.lstat(dest)
    if not stat.S_ISREG(st.st_mode):
        raise Failure(f"{archive_path}: {wait_path} install DEST made DEST no regular file")
    if stat.S_IMODE(st.st_mode) != 0o555:
        raise Failure(f"{archive_path}: {wait_path} install DEST gave DEST mode {stat.S_IMODE(st.st_mode):04o}, not 0555")
    with open(dest, "rb") as f:
        if f.read() != binary:
            raise Failure(f"{archive_path}: {wait_path} install DEST wrote other bytes than the image's {wait_path}")
    copied = runner.run(dest, "--help", what=f"the copy {wait_path} install DEST made, run with --help,")
    if check_usage(archive_path, "the installed copy's --help", copied) != usage:
        raise Failure(f"{archive_path}: the installed copy's --help printed another usage than {wait_path} --help")
    return f"{wait_path}: --help, install (0555, runs)"


def run_one(archive_path: str, path: str, version: str, wait_path: str = DEFAULT_WAIT_PATH) -> str:
    archive = Archive(archive_path)
    plat = platform_str(archive.platform)
    if archive.platform["os"] != "linux" or archive.platform["architecture"] not in ARCHES:
        raise Failure(f"{archive_path}: {plat} is not one this check knows (linux/amd64, linux/arm64)")
    want_machine, uname, qemu_arch = ARCHES[archive.platform["architecture"]]
    with tempfile.TemporaryDirectory() as tmp:
        exe, _ = image_binary(archive, archive_path, path, plat, want_machine, uname, os.path.join(tmp, "operator"))
        runner = Runner(archive_path, uname, qemu_arch)
        out = runner.run(exe, "--version", what=f"{path} --version")
        first = (out.stdout.splitlines() or [""])[0].strip()
        if first != f"safe-termination {version}":
            raise Failure(f"{archive_path}: {path} --version {runner.how} printed {first!r}, not 'safe-termination {version}'")
        waiter = check_waiter(archive, archive_path, wait_path, plat, want_machine, uname, runner, tmp)
    return f"{archive_path}: {plat} ({uname} ELF, {runner.how}): {first}; {waiter}"


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def main(argv: list[str]) -> int:
    parser = Parser(prog="run_binary.py", description="start each image's binary with --version, its waiter with --help and install")
    parser.add_argument("--path", default=DEFAULT_PATH, help=f"the binary in the image (default {DEFAULT_PATH})")
    parser.add_argument("--wait-path", default=DEFAULT_WAIT_PATH, help=f"the preStop waiter in the image (default {DEFAULT_WAIT_PATH})")
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
            print(run_one(path, args.path, args.version, args.wait_path), flush=True)
        except (Failure, UsageError) as e:
            print(f"run_binary.py: FAILED: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
