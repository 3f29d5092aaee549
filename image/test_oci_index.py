#!/usr/bin/env python3
"""Tests of image/oci_index.py and of image/push-index.sh --check (stdlib unittest; no registry):

    python3 -m unittest image/test_oci_index.py     (from the repository root)

Archives of two platforms are written by image/oci_image.py. The push itself, to a real
registry, is image/test_registry.py (make registry-test).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
WRITER = os.path.join(HERE, "oci_image.py")
JOINER = os.path.join(HERE, "oci_index.py")
PUSH = os.path.join(HERE, "push-index.sh")
INDEX = "application/vnd.oci.image.index.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


class OciIndexTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.binary = os.path.join(self.dir, "app")
        with open(self.binary, "wb") as f:
            f.write(b"\x7fELF not really a binary" * 100)
        self.amd64 = self.archive("amd64.tar", "linux/amd64")
        self.arm64 = self.archive("arm64.tar", "linux/arm64", "--label", "arch=arm64")

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def archive(self, name: str, platform: str, *extra: str) -> str:
        path = os.path.join(self.dir, name)
        r = run(
            sys.executable, WRITER, "--out", path, "--name", "st.local/app:1", "--platform", platform,
            "--add", f"{self.binary}:/app:0755", "--entrypoint", '["/app"]',
            "--label", "org.opencontainers.image.version=1", *extra,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        return path

    def layout(self, out: str, *args: str) -> subprocess.CompletedProcess:
        return run(sys.executable, JOINER, "layout", "--out", os.path.join(self.dir, out), "--tag", "1", *args)

    def read(self, out: str, digest: str) -> bytes:
        return self.file(out, "blobs", "sha256", digest.removeprefix("sha256:"))

    def file(self, *path: str) -> bytes:
        with open(os.path.join(self.dir, *path), "rb") as f:
            return f.read()

    def manifest_of(self, archive: str) -> tuple[dict, bytes]:
        with tarfile.open(archive) as tar:
            desc = json.load(tar.extractfile("index.json"))["manifests"][0]
            return desc, tar.extractfile("blobs/sha256/" + desc["digest"].removeprefix("sha256:")).read()

    def test_platform(self) -> None:
        self.assertEqual(run(sys.executable, JOINER, "platform", self.arm64).stdout, "linux/arm64\n")
        self.assertEqual(run(sys.executable, JOINER, "platform", self.amd64).stdout, "linux/amd64\n")

    def test_index_of_two_platforms_in_the_order_asked(self) -> None:
        r = self.layout("l", "--platforms", "linux/arm64 linux/amd64", self.amd64, self.arm64)
        self.assertEqual(r.returncode, 0, r.stderr)
        digest = r.stdout.strip()
        layout_index = json.loads(self.file("l", "index.json"))
        self.assertEqual(layout_index["manifests"], [{
            "mediaType": INDEX, "digest": digest, "size": len(self.read("l", digest)),
            "annotations": {"org.opencontainers.image.ref.name": "1"},
        }])
        self.assertEqual(json.loads(self.file("l", "oci-layout")), {"imageLayoutVersion": "1.0.0"})
        body = self.read("l", digest)
        self.assertEqual(sha256(body), digest)
        index = json.loads(body)
        self.assertEqual((index["schemaVersion"], index["mediaType"]), (2, INDEX))
        self.assertEqual([m["platform"] for m in index["manifests"]],
                         [{"os": "linux", "architecture": "arm64"}, {"os": "linux", "architecture": "amd64"}])
        for m, archive in zip(index["manifests"], [self.arm64, self.amd64]):
            desc, manifest_bytes = self.manifest_of(archive)
            self.assertEqual((m["mediaType"], m["digest"], m["size"]), (desc["mediaType"], desc["digest"], desc["size"]))
            # every blob the manifest names is in the layout, unchanged
            self.assertEqual(self.read("l", m["digest"]), manifest_bytes)
            manifest = json.loads(manifest_bytes)
            for d in [manifest["config"], *manifest["layers"]]:
                self.assertEqual(sha256(self.read("l", d["digest"])), d["digest"])
        # the annotations both manifests share, not the one only arm64 has
        self.assertEqual(index["annotations"], {"org.opencontainers.image.version": "1"})

    def test_deterministic_and_default_order(self) -> None:
        a = self.layout("a", self.arm64, self.amd64).stdout
        b = self.layout("b", self.amd64, self.arm64).stdout
        self.assertEqual(a, b)  # no --platforms: sorted, so the archives' order does not matter
        index = json.loads(self.read("a", a.strip()))
        self.assertEqual([m["platform"]["architecture"] for m in index["manifests"]], ["amd64", "arm64"])

    def test_a_platform_left_out_and_one_missing(self) -> None:
        r = self.layout("one", "--platforms", "linux/amd64", self.amd64, self.arm64)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("left out", r.stderr)
        self.assertEqual(len(json.loads(self.read("one", r.stdout.strip()))["manifests"]), 1)
        r = self.layout("missing", "--platforms", "linux/amd64 linux/arm64", self.amd64)
        self.assertEqual(r.returncode, 3)
        self.assertIn("no archive for linux/arm64 (the archives are linux/amd64)", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "missing")))

    def test_refusals(self) -> None:
        other = self.archive("other.tar", "linux/amd64", "--env", "X=1")
        r = self.layout("dup", self.amd64, other)
        self.assertEqual(r.returncode, 2)
        self.assertIn("are both linux/amd64", r.stderr)
        # a blob that is not what its descriptor says
        bad = os.path.join(self.dir, "bad.tar")
        _, manifest_bytes = self.manifest_of(self.amd64)
        layer = "blobs/sha256/" + json.loads(manifest_bytes)["layers"][0]["digest"].removeprefix("sha256:")
        with tarfile.open(self.amd64) as src, tarfile.open(bad, "w") as dst:
            for m in src.getmembers():
                data = src.extractfile(m).read() if m.isfile() else None
                if m.name == layer:
                    data = data[:-1] + bytes([data[-1] ^ 1])  # one bit flipped
                dst.addfile(m, io.BytesIO(data) if data is not None else None)
        r = self.layout("bad", bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("its content is not what the descriptor names", r.stderr)
        self.assertNotIn("bytes, not the", r.stderr, "the size is right: only the digest differs")
        # an existing non-empty --out
        os.makedirs(os.path.join(self.dir, "full"))
        open(os.path.join(self.dir, "full", "x"), "w").close()
        r = self.layout("full", self.amd64)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not an empty directory", r.stderr)

    def test_push_check_names_what_a_missing_platform_needs(self) -> None:
        r = run(PUSH, "--check", "--platforms", "linux/amd64 linux/arm64", self.amd64, self.arm64)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run(PUSH, "--check", "--platforms", "linux/amd64 linux/arm64", self.amd64)
        self.assertEqual(r.returncode, 1)
        self.assertIn("there is no image of linux/arm64", r.stderr)
        self.assertIn("IMAGE_ARCHIVES=", r.stderr)
        if os.uname().machine == "x86_64":
            sysroot = run("rustc", "--print", "sysroot").stdout.strip()
            if not os.path.isdir(os.path.join(sysroot, "lib/rustlib/aarch64-unknown-linux-musl/lib")):
                self.assertIn("Rust's std for aarch64-unknown-linux-musl is not installed", r.stderr)
            # no archive given: this machine's platform is the one make image builds
            r = run(PUSH, "--check", "--platforms", "linux/amd64")
            self.assertEqual(r.returncode, 0, r.stderr)
            r = run(PUSH, "--check", "--platforms", "linux/s390x")
            self.assertEqual(r.returncode, 1)
            self.assertIn("no Rust target is known", r.stderr)


if __name__ == "__main__":
    unittest.main()
