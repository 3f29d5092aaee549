#!/usr/bin/env python3
"""Tests of image/run_binary.py (stdlib unittest; `make test` runs them):

    python3 -m unittest image/test_run_binary.py     (from the repository root)

The arm64 binary here is NOT the operator: this machine has no Rust std for
aarch64-unknown-linux-musl (and toolchain downloads are not allowed), so the operator cannot be
built for arm64 here. A stand-in Go program, cross-built with the installed Go for linux/arm64
and linux/amd64 (static, CGO off), prints `safe-termination VERSION` as the operator's
`--version` does, and stands in for the preStop waiter too (the same file at both paths): `--help`
prints a usage naming `safe-termination-wait install DEST`, `install DEST` copies
/proc/self/exe to DEST with mode 0555 (variants built with -ldflags -X give another mode, a
failing --help, or no copy at all). It checks what run_binary.py does with any archive: the ELF
machine against the image config, the runs under Debian's qemu-aarch64-static
(e2e/toolchain/qemu.sh, real QEMU user emulation of real aarch64 code; the waiter's install reads
/proc/self/exe there too), the printed version, the waiter's usage and installed copy, and each
failure's message. The release
workflow runs the same check on the real arm64 image (`make image-run`); `make test-image` runs it
natively on this machine's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
WRITER = os.path.join(HERE, "oci_image.py")
RUNNER = os.path.join(HERE, "run_binary.py")
WAITER = "/usr/local/bin/safe-termination-wait"
STAND_IN = """package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
)

// set by -ldflags -X for the variants that fail a check
var (
	installMode = "0555"
	helpExit    = "0"
	installCopy = "yes"
)

func install(dest string) error {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := fmt.Sprintf("%s.tmp-%d", dest, os.Getpid())
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o700)
	if err != nil {
		return err
	}
	if installCopy == "yes" {
		if _, err := io.Copy(out, src); err != nil {
			return err
		}
	}
	mode, _ := strconv.ParseUint(installMode, 8, 32)
	if err := out.Chmod(os.FileMode(mode)); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dest)
}

func main() {
	switch {
	case len(os.Args) == 2 && os.Args[1] == "--version":
		fmt.Println("safe-termination 9.8.7")
		return
	case len(os.Args) == 2 && os.Args[1] == "--help":
		fmt.Print("usage:\\n  safe-termination-wait install DEST\\n")
		code, _ := strconv.Atoi(helpExit)
		os.Exit(code)
	case len(os.Args) == 3 && os.Args[1] == "install":
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintln(os.Stderr, "usage: safe-termination --version")
	os.Exit(2)
}
"""
# amd64 variants of the stand-in (-ldflags -X main.NAME=VALUE) that fail one waiter check
VARIANTS = {
    "mode0755": "-X main.installMode=0755",
    "helpfails": "-X main.helpExit=3",
    "emptycopy": "-X main.installCopy=no",
}


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


class RunBinaryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        if shutil.which("go") is None:
            raise RuntimeError("go not found in PATH: the stand-in binaries are built with Go (make check needs it anyway)")
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        src = os.path.join(d, "src")
        os.mkdir(src)
        with open(os.path.join(src, "main.go"), "w") as f:
            f.write(STAND_IN)
        with open(os.path.join(src, "go.mod"), "w") as f:
            f.write("module standin\n\ngo 1.22\n")
        cls.bins = {}
        builds = [("amd64", "amd64", ""), ("arm64", "arm64", "")]
        builds += [(name, "amd64", ldflags) for name, ldflags in VARIANTS.items()]
        for name, arch, ldflags in builds:
            out = os.path.join(d, f"standin-{name}")
            env = dict(os.environ, GOOS="linux", GOARCH=arch, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
            r = run("go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, ".", cwd=src, env=env)
            if r.returncode != 0:
                raise RuntimeError(f"go build for {name}: {r.stderr}")
            cls.bins[name] = out

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    SAME = "same"

    def archive(self, name: str, platform: str, binary: str | None, dest: str = "/usr/local/bin/safe-termination",
                waiter: str | None = SAME) -> str:
        """An image with `binary` at `dest` and `waiter` (default: the same file) at WAITER;
        None leaves either out."""
        path = os.path.join(self.tmp.name, name)
        args = [sys.executable, WRITER, "--out", path, "--name", "st.local/st:1", "--platform", platform]
        if binary is not None:
            args += ["--add", f"{binary}:{dest}:0755"]
        if waiter == self.SAME:
            waiter = binary
        if waiter is not None:
            args += ["--add", f"{waiter}:{WAITER}:0755"]
        if binary is None and waiter is None:
            args += ["--add-text", "/etc/hostname:x\\n"]
        r = run(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return path

    def check(self, *archives: str, version: str = "9.8.7") -> subprocess.CompletedProcess:
        return run(sys.executable, RUNNER, "--version", version, *archives)

    def test_arm64_binary_runs_under_qemu(self) -> None:
        arm64 = self.archive("arm64.tar", "linux/arm64", self.bins["arm64"])
        r = self.check(arm64)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.strip(),
            f"{arm64}: linux/arm64 (aarch64 ELF, under qemu-aarch64-static): safe-termination 9.8.7; "
            f"{WAITER}: --help, install (0555, runs)",
        )

    def test_amd64_binary_runs_natively_and_both_are_checked(self) -> None:
        amd64 = self.archive("amd64.tar", "linux/amd64", self.bins["amd64"])
        arm64 = self.archive("arm64-both.tar", "linux/arm64", self.bins["arm64"])
        r = self.check(amd64, arm64)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(
            lines[0],
            f"{amd64}: linux/amd64 (x86_64 ELF, natively): safe-termination 9.8.7; {WAITER}: --help, install (0555, runs)",
        )
        self.assertIn("under qemu-aarch64-static", lines[1])
        self.assertTrue(lines[1].endswith(f"; {WAITER}: --help, install (0555, runs)"), lines[1])

    def test_an_arm64_image_holding_an_x86_64_binary_fails(self) -> None:
        wrong = self.archive("wrong.tar", "linux/arm64", self.bins["amd64"])
        r = self.check(wrong)
        self.assertEqual(r.returncode, 1)
        self.assertIn(
            "the image config says linux/arm64, but /usr/local/bin/safe-termination is an ELF binary for x86_64, not aarch64",
            r.stderr,
        )

    def test_another_version_fails_and_names_both(self) -> None:
        arm64 = self.archive("arm64-v.tar", "linux/arm64", self.bins["arm64"])
        r = self.check(arm64, version="1.0.0")
        self.assertEqual(r.returncode, 1)
        self.assertIn("printed 'safe-termination 9.8.7', not 'safe-termination 1.0.0'", r.stderr)

    def test_an_image_without_the_binary_fails(self) -> None:
        empty = self.archive("empty.tar", "linux/arm64", None)
        r = self.check(empty)
        self.assertEqual(r.returncode, 1)
        self.assertIn("the image has no /usr/local/bin/safe-termination", r.stderr)

    def test_an_image_without_the_waiter_fails(self) -> None:
        no_waiter = self.archive("no-waiter.tar", "linux/amd64", self.bins["amd64"], waiter=None)
        r = self.check(no_waiter)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"the image has no {WAITER}", r.stderr)

    def test_a_waiter_of_another_architecture_fails(self) -> None:
        wrong = self.archive("wrong-waiter.tar", "linux/amd64", self.bins["amd64"], waiter=self.bins["arm64"])
        r = self.check(wrong)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"the image config says linux/amd64, but {WAITER} is an ELF binary for aarch64, not x86_64", r.stderr)

    def test_the_waiters_failures_are_named(self) -> None:
        cases = {
            "mode0755": f"{WAITER} install DEST gave DEST mode 0755, not 0555",
            "helpfails": f"{WAITER} --help natively exited 3",
            "emptycopy": f"{WAITER} install DEST wrote other bytes than the image's {WAITER}",
        }
        for variant, message in cases.items():
            with self.subTest(variant=variant):
                archive = self.archive(f"waiter-{variant}.tar", "linux/amd64", self.bins["amd64"], waiter=self.bins[variant])
                r = self.check(archive)
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn(message, r.stderr)
                self.assertNotIn("Traceback", r.stderr)

    def test_a_waiter_path_given_by_the_command_line(self) -> None:
        other = "/opt/wait"
        path = os.path.join(self.tmp.name, "other-waiter.tar")
        r = run(sys.executable, WRITER, "--out", path, "--name", "st.local/st:1", "--platform", "linux/amd64",
                "--add", f"{self.bins['amd64']}:/usr/local/bin/safe-termination:0755", "--add", f"{self.bins['amd64']}:{other}:0755")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run(sys.executable, RUNNER, "--version", "9.8.7", "--wait-path", other, path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().endswith(f"; {other}: --help, install (0555, runs)"), r.stdout)
        self.assertEqual(self.check(path).returncode, 1)

    def test_a_platform_it_does_not_know_fails(self) -> None:
        s390x = self.archive("s390x.tar", "linux/s390x", self.bins["amd64"])
        r = self.check(s390x)
        self.assertEqual(r.returncode, 1)
        self.assertIn("linux/s390x is not one this check knows", r.stderr)

    def test_qemu_given_by_the_environment(self) -> None:
        arm64 = self.archive("arm64-env.tar", "linux/arm64", self.bins["arm64"])
        qemu = run(os.path.join(os.path.dirname(HERE), "e2e", "toolchain", "qemu.sh")).stdout.strip()
        copy = os.path.join(self.tmp.name, "my-qemu-aarch64")
        shutil.copy(qemu, copy)
        r = run(sys.executable, RUNNER, "--version", "9.8.7", arm64, env=dict(os.environ, QEMU_AARCH64=copy))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(aarch64 ELF, under my-qemu-aarch64)", r.stdout)
        missing = os.path.join(self.tmp.name, "no-such-qemu")
        r = run(sys.executable, RUNNER, "--version", "9.8.7", arm64, env=dict(os.environ, QEMU_AARCH64=missing))
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"QEMU_AARCH64={missing} is not an executable file", r.stderr)

    def test_broken_archives_are_named_without_a_traceback(self) -> None:
        import io
        import tarfile

        good = self.archive("whole.tar", "linux/amd64", self.bins["amd64"])
        with open(good, "rb") as f:
            whole = f.read()
        truncated = os.path.join(self.tmp.name, "truncated.tar")
        with open(truncated, "wb") as f:
            f.write(whole[: len(whole) // 2])

        def with_index(name: str, index: bytes) -> str:
            out = os.path.join(self.tmp.name, name)
            with tarfile.open(good) as src, tarfile.open(out, "w") as dst:
                for m in src.getmembers():
                    data = index if m.name == "index.json" else src.extractfile(m).read() if m.isfile() else None
                    if data is not None:
                        m.size = len(data)
                    dst.addfile(m, io.BytesIO(data) if data is not None else None)
            return out

        cases = {
            truncated: "not a readable tar",
            with_index("not-json.tar", b"{not json"): "index.json is not JSON",
            with_index("list.tar", b"[]"): "index.json is a JSON list, not an object",
            with_index("no-manifest.tar", b'{"manifests": [1]}'): "index.json lists 1 manifests, not one image",
        }
        for archive, message in cases.items():
            r = self.check(archive)
            self.assertEqual(r.returncode, 1, archive)
            self.assertIn(message, r.stderr)
            self.assertNotIn("Traceback", r.stderr)

    def test_one_failure_does_not_hide_the_others(self) -> None:
        good = self.archive("good.tar", "linux/amd64", self.bins["amd64"])
        bad = self.archive("bad.tar", "linux/amd64", self.bins["arm64"])
        r = self.check(bad, good)
        self.assertEqual(r.returncode, 1)
        self.assertIn("linux/amd64, but /usr/local/bin/safe-termination is an ELF binary for aarch64", r.stderr)
        self.assertIn(f"{good}: linux/amd64 (x86_64 ELF, natively)", r.stdout)


if __name__ == "__main__":
    unittest.main()
