#!/usr/bin/env python3
"""The release targets against a REAL OCI registry (stdlib unittest; no cluster, no mock):

    make registry-test          (make registry-bins and make image first; make e2e runs it)
    python3 -m unittest image/test_registry.py -v     (from the repository root, once built)

Starts distribution's registry (e2e/toolchain/build-registry.sh) on 127.0.0.1, on a port the
kernel picks (http.addr 127.0.0.1:0; the port is read from its log), with a config file written
here and its storage in a temporary directory; stops it by its PID at the end. Then:

- `make image-index REGISTRY=127.0.0.1:PORT IMAGE_ARCHIVES=ARCHIVE` pushes the operator image
  as an index (crane): the registry's HTTP API serves the printed digest as an OCI image index
  (`GET /v2/safe-termination/manifests/<digest>`, Accept: the index media type) listing
  linux/amd64, whose manifest, config and layers are byte for byte the archive's; the tag
  names the same index; crane resolves linux/amd64 to that manifest; a second push gives the
  same digest.
- PLATFORMS="linux/amd64 linux/arm64" without an arm64 archive fails before pushing, naming
  what is missing (on x86_64 without it: Rust's std for aarch64-unknown-linux-musl).
- `make chart-push REGISTRY=127.0.0.1:PORT` pushes the chart (helm); `helm pull oci://...`
  returns the same bytes under the same digest, the registry's manifest is Helm's (config and
  chart layer media types, the layer's digest the .tgz's), and `helm template` of the oci://
  chart with image.repository and image.digest renders the operator's image as
  REPOSITORY@DIGEST: what docs/install.md's install command does.

The archive: $ST_OPERATOR_IMAGE, default
${ST_CACHE_DIR:-~/.cache/safe-termination}/images/safe-termination-VERSION.tar (make image). A
missing archive, registry, crane or helm FAILS the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import unittest
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_CHART = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


def field(path: str, key: str) -> str:
    """A top-level `key: value` of a YAML or TOML file (quotes dropped)."""
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            m = re.match(rf'^{key}\s*[:=]\s*"?([^"\s]+)"?\s*$', line)
            if m:
                return m.group(1)
    raise AssertionError(f"no {key} in {path}")


VERSION = field("Cargo.toml", "version")
CHART_VERSION = field("charts/safe-termination/Chart.yaml", "version")
CACHE = os.environ.get("ST_CACHE_DIR") or os.path.expanduser("~/.cache/safe-termination")
ARCHIVE = os.environ.get("ST_OPERATOR_IMAGE") or os.path.join(CACHE, "images", f"safe-termination-{VERSION}.tar")


def k8s_version() -> str:
    v = os.environ.get("ST_K8S_VERSION")
    if not v:
        with open(os.path.join(ROOT, "e2e/toolchain/k8s-version")) as f:
            v = f.read().strip()
    return v.removeprefix("v")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def run(*cmd: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    # a make of its own: not the variables of the make that runs this test (make registry-test)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def make(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run("make", "--no-print-directory", "-s", *args, check=check)


class Registry:
    """distribution's registry on 127.0.0.1, its port picked by the kernel, stopped by PID."""

    def __init__(self, binary: str, workdir: str):
        self.storage = os.path.join(workdir, "storage")
        self.config = os.path.join(workdir, "config.yml")
        self.log_path = os.path.join(workdir, "registry.log")
        os.makedirs(self.storage)
        with open(self.config, "w") as f:
            f.write(
                "version: 0.1\n"
                "log:\n  level: info\n  accesslog:\n    disabled: true\n"
                f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
                "  maintenance:\n    uploadpurging:\n      enabled: false\n"
                "http:\n  addr: 127.0.0.1:0\n  secret: registry-test-only\n"
            )
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "serve", self.config], stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)
        try:
            self.port = self._wait_for_port(20)
        except BaseException:
            self.stop()
            raise
        self.host = f"127.0.0.1:{self.port}"

    def _wait_for_port(self, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the registry exited with {self.proc.returncode}: {self.text_log()}")
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.text_log())
            if m:
                port = int(m.group(1))
                status, headers, _ = self.get_url(f"http://127.0.0.1:{port}/v2/")
                if status == 200 and headers.get("Docker-Distribution-Api-Version") == "registry/2.0":
                    return port
            time.sleep(0.1)
        raise AssertionError(f"the registry did not listen within {seconds} s: {self.text_log()}")

    def text_log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    @staticmethod
    def get_url(url: str, accept: str | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
        req = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def get(self, path: str, accept: str | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
        return self.get_url(f"http://{self.host}{path}", accept, method)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM to this PID only
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


class ArchiveImage:
    """The single-platform image in the OCI archive make image writes."""

    def __init__(self, path: str):
        with tarfile.open(path) as tar:
            self.files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        desc = json.loads(self.files["index.json"])["manifests"][0]
        self.manifest_digest = desc["digest"]
        self.manifest_bytes = self.blob(desc["digest"])
        self.manifest = json.loads(self.manifest_bytes)

    def blob(self, digest: str) -> bytes:
        return self.files["blobs/sha256/" + digest.removeprefix("sha256:")]


class RegistryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        if not os.path.isfile(ARCHIVE):
            raise AssertionError(f"no operator image at {ARCHIVE}: run `make image` (or set ST_OPERATOR_IMAGE)")
        cls.image = ArchiveImage(ARCHIVE)
        registry_bin, cls.crane = run(os.path.join(ROOT, "e2e/toolchain/build-registry.sh"), "registry", "crane").stdout.split()
        cls.helm = os.path.join(CACHE, f"k8s-v{k8s_version()}", "bin", "helm")
        cls.tmp = tempfile.mkdtemp(prefix="st-registry-test.")
        cls.registry = Registry(registry_bin, cls.tmp)
        cls.repo = f"{cls.registry.host}/safe-termination"

    @classmethod
    def tearDownClass(cls) -> None:
        registry = getattr(cls, "registry", None)
        if registry is not None:
            registry.stop()
        if getattr(cls, "tmp", None):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def push_index(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return make("image-index", f"REGISTRY={self.registry.host}", f"IMAGE_ARCHIVES={ARCHIVE}", *extra, check=check)

    def test_image_index_lists_linux_amd64_with_the_archives_manifest(self) -> None:
        r = self.push_index()
        ref = r.stdout.strip().splitlines()[-1]
        self.assertRegex(ref, rf"^{re.escape(self.repo)}@sha256:[0-9a-f]{{64}}$", r.stderr)
        digest = ref.split("@", 1)[1]

        # the registry serves the index under the printed digest, and the tag names it
        status, headers, body = self.registry.get(f"/v2/safe-termination/manifests/{digest}", INDEX)
        self.assertEqual(status, 200, body)
        self.assertEqual(headers["Content-Type"], INDEX)
        self.assertEqual(headers["Docker-Content-Digest"], digest)
        self.assertEqual(sha256(body), digest)
        index = json.loads(body)
        self.assertEqual((index["schemaVersion"], index["mediaType"]), (2, INDEX))
        platforms = [(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]]
        self.assertEqual(platforms, [("linux", "amd64")])
        child = index["manifests"][0]
        self.assertEqual(child["mediaType"], MANIFEST)
        self.assertEqual((child["digest"], child["size"]), (self.image.manifest_digest, len(self.image.manifest_bytes)))
        self.assertEqual(index["annotations"]["org.opencontainers.image.version"], VERSION)
        status, headers, _ = self.registry.get(f"/v2/safe-termination/manifests/{VERSION}", INDEX, method="HEAD")
        self.assertEqual((status, headers.get("Docker-Content-Digest")), (200, digest), f"tag {VERSION}")

        # the platform's manifest, config and layers are the archive's, byte for byte
        status, headers, body = self.registry.get(f"/v2/safe-termination/manifests/{child['digest']}", MANIFEST)
        self.assertEqual((status, headers["Content-Type"]), (200, MANIFEST))
        self.assertEqual(body, self.image.manifest_bytes)
        manifest = json.loads(body)
        for desc in [manifest["config"], *manifest["layers"]]:
            status, headers, blob = self.registry.get(f"/v2/safe-termination/blobs/{desc['digest']}")
            self.assertEqual(status, 200, desc)
            self.assertEqual(blob, self.image.blob(desc["digest"]), desc["digest"])
            self.assertEqual((sha256(blob), len(blob)), (desc["digest"], desc["size"]))
        config = json.loads(self.image.blob(manifest["config"]["digest"]))
        self.assertEqual((config["os"], config["architecture"]), ("linux", "amd64"))

        # the push tool agrees: linux/amd64 resolves to the archive's manifest
        crane = run(self.crane, "--insecure", "digest", "--platform", "linux/amd64", f"{self.repo}:{VERSION}").stdout.strip()
        self.assertEqual(crane, self.image.manifest_digest)
        self.assertEqual(run(self.crane, "--insecure", "digest", f"{self.repo}:{VERSION}").stdout.strip(), digest)

        # deterministic: the same archive pushed again is the same index
        again = self.push_index().stdout.strip().splitlines()[-1]
        self.assertEqual(again, ref)

    def test_arm64_without_its_image_fails_before_pushing(self) -> None:
        r = self.push_index("PLATFORMS=linux/amd64 linux/arm64", "VERSION=0.0.0-arm64-refused", check=False)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("there is no image of linux/arm64", r.stderr)
        if os.uname().machine == "x86_64":
            sysroot = run("rustc", "--print", "sysroot").stdout.strip()
            if not os.path.isdir(os.path.join(sysroot, "lib/rustlib/aarch64-unknown-linux-musl/lib")):
                self.assertIn("Rust's std for aarch64-unknown-linux-musl is not installed", r.stderr)
        status, _, _ = self.registry.get("/v2/safe-termination/manifests/0.0.0-arm64-refused", INDEX, method="HEAD")
        self.assertEqual(status, 404, "nothing pushed")

    def test_chart_push_then_pull_and_template_by_digest(self) -> None:
        dist = os.path.join(self.tmp, "dist")
        r = make("chart-push", f"REGISTRY={self.registry.host}", f"DIST={dist}")
        ref = r.stdout.strip().splitlines()[-1]
        chart_repo = f"{self.registry.host}/charts/safe-termination"
        self.assertRegex(ref, rf"^{re.escape(chart_repo)}@sha256:[0-9a-f]{{64}}$", r.stderr)
        digest = ref.split("@", 1)[1]
        with open(os.path.join(dist, f"safe-termination-{CHART_VERSION}.tgz"), "rb") as f:
            packaged = f.read()

        # the registry holds Helm's artifact: its layer is the packaged .tgz
        status, headers, body = self.registry.get(f"/v2/charts/safe-termination/manifests/{CHART_VERSION}", MANIFEST)
        self.assertEqual((status, headers.get("Docker-Content-Digest"), sha256(body)), (200, digest, digest))
        manifest = json.loads(body)
        self.assertEqual(manifest["config"]["mediaType"], HELM_CONFIG)
        self.assertEqual([(d["mediaType"], d["digest"]) for d in manifest["layers"]], [(HELM_CHART, sha256(packaged))])

        # helm pull returns the same chart under the same digest
        pulled = os.path.join(self.tmp, "pulled")
        os.makedirs(pulled)
        r = run(self.helm, "pull", f"oci://{chart_repo}", "--version", CHART_VERSION, "--plain-http", "-d", pulled)
        self.assertIn(f"Digest: {digest}", r.stdout + r.stderr)
        with open(os.path.join(pulled, f"safe-termination-{CHART_VERSION}.tgz"), "rb") as f:
            self.assertEqual(sha256(f.read()), sha256(packaged))

        # the documented install, rendered: the oci:// chart with the image pinned by digest
        image_digest = "sha256:" + "ab" * 32
        out = run(
            self.helm, "template", "safe-termination", f"oci://{chart_repo}", "--version", CHART_VERSION, "--plain-http",
            "-n", "safe-termination", "--set", f"image.repository={self.repo},image.digest={image_digest}",
        ).stdout
        images = set(re.findall(r"^\s+image: (\S+)$", out, re.M))
        self.assertEqual(images, {f"{self.repo}@{image_digest}"})


if __name__ == "__main__":
    unittest.main()
