#!/usr/bin/env python3
"""Tests of image/oci_image.py (stdlib unittest):

    python3 -m unittest image/test_oci_image.py     (from the repository root)
    python3 image/test_oci_image.py
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oci_image.py")


def load_module():
    spec = importlib.util.spec_from_file_location("oci_image", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class OciImageTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.binary = os.path.join(self.dir, "app")
        with open(self.binary, "wb") as f:
            f.write(b"\x7fELF not really a binary" * 100)
        os.chmod(self.binary, 0o700)

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def build(self, out: str, *extra: str) -> bytes:
        path = os.path.join(self.dir, out)
        r = run(
            "--out", path,
            "--name", "st.local/testapp:1",
            "--add", f"{self.binary}:/st-testapp:0755",
            "--add-dir-empty", "/tmp:1777",
            "--add-text", r"/etc/passwd:root:x:0:0::/:/sbin/nologin\nnonroot:x:65532:65532::/:/sbin/nologin\n",
            "--entrypoint", '["/st-testapp","serve"]',
            "--cmd", '["--graceful"]',
            "--user", "65532:65532",
            "--env", "RUST_LOG=info",
            "--label", "org.example=e2e",
            "--expose", "8080/tcp",
            "--workdir", "/",
            *extra,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(path, "rb") as f:
            return f.read()

    def open_layout(self, data: bytes) -> dict[str, bytes]:
        files = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                self.assertEqual((m.mtime, m.uid, m.gid), (0, 0, 0), m.name)
                if m.isfile():
                    files[m.name] = tar.extractfile(m).read()
        return files

    def test_same_inputs_give_identical_bytes(self) -> None:
        a = self.build("a.tar")
        # a different mtime of the source must not matter
        os.utime(self.binary, (1_000_000, 1_000_000))
        b = self.build("b.tar")
        self.assertEqual(sha256(a), sha256(b))
        self.assertEqual(a, b)
        c = self.build("c.tar", "--env", "EXTRA=1")
        self.assertNotEqual(a, c)

    def test_layout_blobs_and_descriptors(self) -> None:
        files = self.open_layout(self.build("a.tar"))
        self.assertEqual(json.loads(files["oci-layout"]), {"imageLayoutVersion": "1.0.0"})
        index = json.loads(files["index.json"])
        self.assertEqual(index["schemaVersion"], 2)
        self.assertEqual(len(index["manifests"]), 1)
        desc = index["manifests"][0]
        self.assertEqual(desc["annotations"], {
            "io.containerd.image.name": "st.local/testapp:1",
            "org.opencontainers.image.ref.name": "1",
        })
        self.assertEqual(desc["platform"], {"architecture": "amd64", "os": "linux"})
        blobs = {f"sha256:{name.rsplit('/', 1)[1]}": data for name, data in files.items() if name.startswith("blobs/sha256/")}
        self.assertEqual(len(blobs), 3)  # config, manifest, layer
        for digest, data in blobs.items():
            self.assertEqual(sha256(data), digest)

        def resolve(d: dict) -> bytes:
            data = blobs[d["digest"]]
            self.assertEqual(len(data), d["size"])
            return data

        manifest = json.loads(resolve(desc))
        self.assertEqual(desc["mediaType"], "application/vnd.oci.image.manifest.v1+json")
        self.assertEqual(manifest["mediaType"], desc["mediaType"])
        config = json.loads(resolve(manifest["config"]))
        self.assertEqual(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json")
        self.assertEqual(len(manifest["layers"]), 1)
        layer_desc = manifest["layers"][0]
        self.assertEqual(layer_desc["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip")
        layer_gz = resolve(layer_desc)
        layer = gzip.decompress(layer_gz)
        self.assertEqual(config["rootfs"], {"type": "layers", "diff_ids": [sha256(layer)]})
        self.assertEqual((config["architecture"], config["os"]), ("amd64", "linux"))
        self.assertEqual(config["config"], {
            "Entrypoint": ["/st-testapp", "serve"],
            "Cmd": ["--graceful"],
            "User": "65532:65532",
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "RUST_LOG=info"],
            "Labels": {"org.example": "e2e"},
            "ExposedPorts": {"8080/tcp": {}},
            "WorkingDir": "/",
        })
        # gzip header mtime 0
        self.assertEqual(layer_gz[4:8], b"\0\0\0\0")

    def test_layer_holds_files_with_modes_and_parents(self) -> None:
        files = self.open_layout(self.build("a.tar"))
        index = json.loads(files["index.json"])
        manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]])
        layer = gzip.decompress(files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]])
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            members = tar.getmembers()
            names = [m.name for m in members]
            self.assertEqual(names, sorted(names))
            by_name = {m.name: m for m in members}
            self.assertEqual(set(by_name), {"etc", "etc/passwd", "st-testapp", "tmp"})
            self.assertTrue(by_name["etc"].isdir())
            self.assertEqual(by_name["etc"].mode, 0o755)
            self.assertTrue(by_name["tmp"].isdir())
            self.assertEqual(by_name["tmp"].mode, 0o1777)
            self.assertEqual(by_name["st-testapp"].mode, 0o755)
            self.assertEqual(by_name["etc/passwd"].mode, 0o644)
            for m in members:
                self.assertEqual((m.mtime, m.uid, m.gid, m.uname, m.gname), (0, 0, 0, "", ""), m.name)
            with open(self.binary, "rb") as f:
                self.assertEqual(tar.extractfile("st-testapp").read(), f.read())
            self.assertEqual(
                tar.extractfile("etc/passwd").read(),
                b"root:x:0:0::/:/sbin/nologin\nnonroot:x:65532:65532::/:/sbin/nologin\n",
            )

    def test_owner_and_source_mode_and_directory_tree(self) -> None:
        tree = os.path.join(self.dir, "tree")
        os.makedirs(os.path.join(tree, "sub"))
        with open(os.path.join(tree, "sub", "f.txt"), "w") as f:
            f.write("x")
        os.chmod(os.path.join(tree, "sub", "f.txt"), 0o640)
        out = os.path.join(self.dir, "t.tar")
        r = run("--out", out, "--name", "st.local/t:1", "--add", f"{tree}:/data", "--add", f"{self.binary}:/bin/app",
                "--owner", "65532:65532")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            files = self.open_layout(f.read())
        index = json.loads(files["index.json"])
        manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]])
        layer = gzip.decompress(files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]])
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            by_name = {m.name: m for m in tar.getmembers()}
        self.assertEqual(set(by_name), {"bin", "bin/app", "data", "data/sub", "data/sub/f.txt"})
        self.assertEqual(by_name["bin/app"].mode, 0o700)  # the source's mode
        self.assertEqual(by_name["data/sub/f.txt"].mode, 0o640)
        self.assertTrue(all((m.uid, m.gid) == (65532, 65532) for m in by_name.values()))

    def test_chown_gives_one_entry_its_own_owner(self) -> None:
        out = os.path.join(self.dir, "c.tar")
        r = run("--out", out, "--name", "st.local/c:1", "--add", f"{self.binary}:/bin/app",
                "--add-dir-empty", "/home/nonroot:0700", "--chown", "/home/nonroot:65532:65532")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            files = self.open_layout(f.read())
        index = json.loads(files["index.json"])
        manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]])
        layer = gzip.decompress(files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]])
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            owners = {m.name: (m.uid, m.gid) for m in tar.getmembers()}
        self.assertEqual(owners, {"bin": (0, 0), "bin/app": (0, 0), "home": (0, 0), "home/nonroot": (65532, 65532)})

    def test_name_normalisation(self) -> None:
        m = load_module()
        self.assertEqual(m.normalize_name("st.local/pause:1"), ("st.local/pause:1", "1"))
        self.assertEqual(m.normalize_name("pause:1"), ("docker.io/library/pause:1", "1"))
        self.assertEqual(m.normalize_name("foo/bar"), ("docker.io/foo/bar:latest", "latest"))
        self.assertEqual(m.normalize_name("localhost/x:2"), ("localhost/x:2", "2"))
        self.assertEqual(m.normalize_name("reg:5000/a/b:v1.2"), ("reg:5000/a/b:v1.2", "v1.2"))

    def test_bad_arguments_exit_2_naming_the_problem(self) -> None:
        out = os.path.join(self.dir, "x.tar")
        cases = [
            (["--name", "st.local/x:1", "--add", "/does/not/exist:/x"], "does not exist"),
            (["--name", "st.local/x:1", "--add", "just-a-path"], "expected SRC:DEST[:MODE]"),
            (["--name", "st.local/x:1", "--add", f"{self.binary}:relative"], "must be an absolute path"),
            (["--name", "st.local/x:1", "--add", f"{self.binary}:/x:999"], "not an octal mode"),
            (["--name", "st.local/x:1", "--add", f"{self.binary}:/x", "--add", f"{self.binary}:/x"], "given twice"),
            (["--name", "st.local/x:1", "--add", f"{self.binary}:/x", "--add-text", "/x/y:z"], "needs it to be a directory"),
            (["--name", "st.local/x:1", "--add-text", "/a:b", "--entrypoint", "/st-testapp"], "--entrypoint"),
            (["--name", "st.local/x:1", "--add-text", "/a:b", "--env", "NOVALUE"], "KEY=VALUE"),
            (["--name", "st.local/x:1", "--add-text", "/a:b", "--expose", "http"], "--expose"),
            (["--name", "st.local/x:1", "--add-text", "/a:b\\q"], "unsupported escape"),
            (["--name", "Upper/Case:1", "--add-text", "/a:b"], "invalid repository path"),
            (["--name", "st.local/x:1"], "nothing to put in the image"),
            (["--name", "st.local/x:1", "--add-text", "/a:b", "--bogus"], "unrecognized arguments"),
            (["--name", "st.local/x:1", "--add-text", "/a:b", "--chown", "/a:root:0"], "expected /DEST:UID:GID"),
            (["--name", "st.local/x:1", "--add-text", "/a:b", "--chown", "/nope:1:1"], "/nope is not in the layer"),
        ]
        for args, expected in cases:
            with self.subTest(args=args):
                r = run("--out", out, *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expected, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertFalse(os.path.exists(out))
        r = run("--name", "st.local/x:1", "--add-text", "/a:b")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--out", r.stderr)


if __name__ == "__main__":
    unittest.main()
