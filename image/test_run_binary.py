#!/usr/bin/env python3
"""Tests of image/run_binary.py (stdlib unittest; `make test` runs them):

    python3 -m unittest image/test_run_binary.py     (from the repository root)

The arm64 binary here is NOT the operator: this machine has no Rust std for
aarch64-unknown-linux-musl (and toolchain downloads are not allowed), so the operator cannot be
built for arm64 here. A stand-in Go program, cross-built with the installed Go for linux/arm64
and linux/amd64 (static, CGO off), prints `safe-termination VERSION` as the operator's
`--version` does. It checks what run_binary.py does with any archive: the ELF machine against the
image config, the run under Debian's qemu-aarch64-static (e2e/toolchain/qemu.sh, real QEMU user
emulation of real aarch64 code), the printed version, and each failure's message. The release
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
STAND_IN = """package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println("safe-termination 9.8.7")
		return
	}
	fmt.Fprintln(os.Stderr, "usage: safe-termination --version")
	os.Exit(2)
}
"""


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
        for arch in ("amd64", "arm64"):
            out = os.path.join(d, f"standin-{arch}")
            env = dict(os.environ, GOOS="linux", GOARCH=arch, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
            r = run("go", "build", "-trimpath", "-o", out, ".", cwd=src, env=env)
            if r.returncode != 0:
                raise RuntimeError(f"go build for {arch}: {r.stderr}")
            cls.bins[arch] = out

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def archive(self, name: str, platform: str, binary: str | None, dest: str = "/usr/local/bin/safe-termination") -> str:
        path = os.path.join(self.tmp.name, name)
        args = [sys.executable, WRITER, "--out", path, "--name", "st.local/st:1", "--platform", platform]
        if binary is not None:
            args += ["--add", f"{binary}:{dest}:0755"]
        else:
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
            f"{arm64}: linux/arm64 (aarch64 ELF, under qemu-aarch64-static): safe-termination 9.8.7",
        )

    def test_amd64_binary_runs_natively_and_both_are_checked(self) -> None:
        amd64 = self.archive("amd64.tar", "linux/amd64", self.bins["amd64"])
        arm64 = self.archive("arm64-both.tar", "linux/arm64", self.bins["arm64"])
        r = self.check(amd64, arm64)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(lines[0], f"{amd64}: linux/amd64 (x86_64 ELF, natively): safe-termination 9.8.7")
        self.assertIn("under qemu-aarch64-static", lines[1])

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
