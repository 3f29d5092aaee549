#!/usr/bin/env python3
"""Checks the BUILT operator image against the Dockerfile (stdlib unittest).

    make image && python3 -m unittest image/test_image.py -v     (from the repository root)

The archive: $ST_OPERATOR_IMAGE, default
${ST_CACHE_DIR:-~/.cache/safe-termination}/images/safe-termination-VERSION.tar (VERSION:
Cargo.toml's). A missing archive FAILS the image tests (run `make image`); `make check` builds
it first.

From the Dockerfile's final stage (parse_dockerfile): ENTRYPOINT, CMD, USER, EXPOSE and every
LABEL must be the image config's; it must COPY the preStop waiter to
/usr/local/bin/safe-termination-wait, and each file it copies (the operator at the
ENTRYPOINT's path, the waiter) must be in the image: a regular file, 0755, root's, a static ELF
(no PT_INTERP: image/elf_interp.py). From distroless/static-debian12:nonroot, the base that stage
names: /etc/passwd with uid 65532, the CA bundle, /home/nonroot (65532), /tmp (1777), Env
PATH and SSL_CERT_FILE, WorkingDir /home/nonroot. The name annotation must be the chart's
default image, ghcr.io/safe-termination/safe-termination:VERSION.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import shlex
import tarfile
import tomllib
import unittest
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
REPOSITORY = "ghcr.io/safe-termination/safe-termination"
# the preStop waiter: the operator's injected init container runs
# ["/usr/local/bin/safe-termination-wait", "install", "/safe-termination/bin/safe-termination-wait"]
WAITER = "/usr/local/bin/safe-termination-wait"


# --- the Dockerfile --------------------------------------------------------


@dataclass
class Stage:
    """What the final stage of a Dockerfile sets (None: not set)."""

    base: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    user: str | None = None
    exposed: set[str] = field(default_factory=set)
    labels: dict[str, str] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)


@dataclass
class Copy:
    """One COPY (or ADD) instruction: its --flags (--from=build -> {"from": "build"}), sources
    and destination."""

    sources: list[str]
    dest: str
    flags: dict[str, str] = field(default_factory=dict)


def logical_lines(text: str) -> list[str]:
    """Instructions one a line: comments dropped, backslash continuations joined."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):  # a comment inside a continuation
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def exec_form(args: str) -> list[str]:
    """ENTRYPOINT/CMD arguments: the JSON (exec) form, or the shell form as Docker runs it."""
    if args.startswith("["):
        try:
            value = json.loads(args)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return ["/bin/sh", "-c", args]


def parse_labels(args: str) -> dict[str, str]:
    """LABEL k=v k2="v w" ... (or the old LABEL k v form)."""
    words = shlex.split(args)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    labels = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"LABEL {args!r}: {word!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def parse_copy(args: str) -> Copy:
    """COPY [--flag=value ...] SRC... DEST, or the JSON form COPY [--flag ...] ["SRC", ..., "DEST"]."""
    flags: dict[str, str] = {}
    rest = args
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        key, _, value = word[2:].partition("=")
        flags[key] = value
        rest = rest.strip()
    words = None
    if rest.startswith("["):
        try:
            words = json.loads(rest)
        except json.JSONDecodeError:
            words = None
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            words = None
    if words is None:
        words = rest.split()
    if len(words) < 2:
        raise ValueError(f"COPY {args!r}: needs at least one source and a destination")
    return Copy(sources=words[:-1], dest=words[-1], flags=flags)


def parse_dockerfile(text: str) -> Stage:
    """The final stage: each FROM starts a new one, so only the last counts."""
    stage: Stage | None = None
    for line in logical_lines(text):
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), args.strip()
        if instruction == "FROM":
            stage = Stage(base=args.split()[0])
        elif stage is None:
            continue  # ARG before the first FROM
        elif instruction == "ENTRYPOINT":
            stage.entrypoint = exec_form(args)
        elif instruction == "CMD":
            stage.cmd = exec_form(args)
        elif instruction == "USER":
            stage.user = args
        elif instruction == "EXPOSE":
            for port in args.split():
                stage.exposed.add(port if "/" in port else f"{port}/tcp")
        elif instruction == "LABEL":
            stage.labels.update(parse_labels(args))
        elif instruction in ("COPY", "ADD"):
            stage.copies.append(parse_copy(args))
    if stage is None:
        raise ValueError("no FROM in the Dockerfile")
    return stage


# --- the image -------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def cargo_package() -> dict:
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["package"]


def cargo_version() -> str:
    return cargo_package()["version"]


def archive_path() -> str:
    default = os.path.join(
        os.environ.get("ST_CACHE_DIR") or os.path.expanduser("~/.cache/safe-termination"),
        "images",
        f"safe-termination-{cargo_version()}.tar",
    )
    return os.environ.get("ST_OPERATOR_IMAGE") or default


@dataclass
class Image:
    path: str
    index_entry: dict  # the manifest's descriptor in index.json
    manifest: dict
    config: dict
    layer: dict[str, tuple[tarfile.TarInfo, bytes]]  # path without leading '/' -> (entry, data)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def load_image(path: str) -> Image:
    """Reads index.json -> manifest -> config and the layer, checking every blob's digest."""
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    def blob(descriptor: dict) -> bytes:
        algo, hex_digest = descriptor["digest"].split(":", 1)
        data = files[f"blobs/{algo}/{hex_digest}"]
        if sha256(data) != descriptor["digest"] or len(data) != descriptor["size"]:
            raise ValueError(f"{path}: blob {descriptor['digest']} does not match its descriptor")
        return data

    index = json.loads(files["index.json"])
    if len(index["manifests"]) != 1:
        raise ValueError(f"{path}: expected one manifest in index.json, found {len(index['manifests'])}")
    entry = index["manifests"][0]
    manifest = json.loads(blob(entry))
    config = json.loads(blob(manifest["config"]))
    layer: dict[str, tuple[tarfile.TarInfo, bytes]] = {}
    for descriptor in manifest["layers"]:
        data = blob(descriptor)
        if descriptor["mediaType"].endswith("+gzip"):
            data = gzip.decompress(data)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                content = tar.extractfile(m).read() if m.isfile() else b""
                layer[m.name.rstrip("/")] = (m, content)
    return Image(path, entry, manifest, config, layer)


class ImageCase(unittest.TestCase):
    """Loads the built archive; FAILS (never skips) when it is missing."""

    def image(self) -> Image:
        path = archive_path()
        if not os.path.isfile(path):
            self.fail(f"no operator image at {path}: run `make image` (or set ST_OPERATOR_IMAGE)")
        return load_image(path)

    def exec_config(self) -> dict:
        return self.image().config.get("config", {})

    def entry(self, path: str) -> tuple[tarfile.TarInfo, bytes]:
        layer = self.image().layer
        self.assertIn(path.strip("/"), layer, f"{path} is not in the image")
        return layer[path.strip("/")]


class ImageMatchesDockerfile(ImageCase):
    @classmethod
    def setUpClass(cls) -> None:
        with open(DOCKERFILE, encoding="utf-8") as f:
            cls.stage = parse_dockerfile(f.read())

    def test_entrypoint_and_cmd(self) -> None:
        self.assertEqual(self.exec_config().get("Entrypoint"), self.stage.entrypoint)
        self.assertEqual(self.exec_config().get("Cmd"), self.stage.cmd)

    def test_user(self) -> None:
        self.assertEqual(self.exec_config().get("User"), self.stage.user)

    def test_exposed_ports(self) -> None:
        self.assertEqual(set(self.exec_config().get("ExposedPorts", {})), self.stage.exposed)

    def test_labels(self) -> None:
        self.assertTrue(self.stage.labels, "the Dockerfile's final stage has no LABEL")
        labels = self.exec_config().get("Labels", {})
        for key, value in self.stage.labels.items():
            with self.subTest(label=key):
                self.assertEqual(labels.get(key), value)

    def test_version_label_is_cargo_version(self) -> None:
        self.assertEqual(self.stage.labels.get("org.opencontainers.image.version"), cargo_version(),
                         "the Dockerfile's version label must be Cargo.toml's version")

    def binaries(self) -> list[str]:
        """The ENTRYPOINT's path and every file the final stage copies (the operator, the waiter)."""
        paths = [self.stage.entrypoint[0]]
        for copy in self.stage.copies:
            if copy.dest not in paths:
                paths.append(copy.dest)
        return paths

    def assert_static_binary(self, path: str) -> None:
        """A regular file, 0755, root's, an ELF with no interpreter: distroless/static has no
        loader (and a dynamic musl binary passes ldd)."""
        import sys
        import tempfile

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from elf_interp import interpreter

        info, data = self.entry(path)
        self.assertTrue(info.isfile(), f"{path} is not a regular file")
        self.assertEqual(info.mode, 0o755, path)
        self.assertEqual((info.uid, info.gid), (0, 0), path)
        self.assertEqual(data[:4], b"\x7fELF", path)
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            self.assertEqual(interpreter(f.name), "", f"{path} asks for a loader")

    def test_binary_at_entrypoint_path(self) -> None:
        self.assert_static_binary(self.stage.entrypoint[0])

    def test_dockerfile_copies_the_waiter(self) -> None:
        copies = [c for c in self.stage.copies if c.dest == WAITER]
        self.assertEqual(len(copies), 1, f"the Dockerfile's final stage must COPY the waiter to {WAITER} once")
        self.assertEqual(copies[0].flags.get("from"), "build", "the waiter comes from the build stage")

    def test_waiter_is_a_static_binary(self) -> None:
        self.assert_static_binary(WAITER)

    def test_every_copied_binary(self) -> None:
        self.assertIn(WAITER, self.binaries())
        for path in self.binaries():
            with self.subTest(path=path):
                self.assert_static_binary(path)

    def test_waiter_is_not_the_operator(self) -> None:
        _, operator = self.entry(self.stage.entrypoint[0])
        _, waiter = self.entry(WAITER)
        self.assertNotEqual(operator, waiter)
        self.assertIn(b"safe-termination-wait install DEST", waiter, "the waiter's usage is not in the file")

    def test_name_is_the_charts_default_image(self) -> None:
        annotations = self.image().index_entry.get("annotations", {})
        self.assertEqual(annotations.get("io.containerd.image.name"), f"{REPOSITORY}:{cargo_version()}")


class ImageHasWhatDistrolessGives(ImageCase):
    def test_passwd_has_nonroot_65532(self) -> None:
        _, data = self.entry("/etc/passwd")
        uids = {line.split(":")[2] for line in data.decode().splitlines() if line.count(":") == 6}
        self.assertIn("65532", uids)
        self.assertIn("0", uids)

    def test_group_has_nonroot_65532(self) -> None:
        _, data = self.entry("/etc/group")
        self.assertIn("nonroot:x:65532:", data.decode().splitlines())

    def test_ca_bundle(self) -> None:
        info, data = self.entry("/etc/ssl/certs/ca-certificates.crt")
        self.assertGreater(len(data), 0)
        self.assertIn(b"BEGIN CERTIFICATE", data)
        self.assertEqual(info.mode, 0o644)

    def test_home_and_tmp(self) -> None:
        home, _ = self.entry("/home/nonroot")
        self.assertTrue(home.isdir())
        self.assertEqual((home.uid, home.gid, home.mode), (65532, 65532, 0o700))
        tmp, _ = self.entry("/tmp")
        self.assertTrue(tmp.isdir())
        self.assertEqual(tmp.mode, 0o1777)

    def test_env_and_workdir(self) -> None:
        env = self.exec_config().get("Env", [])
        self.assertIn("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", env)
        self.assertIn("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", env)
        self.assertEqual(self.exec_config().get("WorkingDir"), "/home/nonroot")

    def test_everything_else_belongs_to_root(self) -> None:
        for path, (info, _) in self.image().layer.items():
            if path != "home/nonroot":
                self.assertEqual((info.uid, info.gid), (0, 0), path)


class DockerfileParser(unittest.TestCase):
    SAMPLE = """\
# syntax=docker/dockerfile:1
ARG BASE=debian
FROM rust:1 AS build
ENTRYPOINT ["/wrong"]
CMD ["wrong"]
USER 0
EXPOSE 1
LABEL org.example.stage=build

FROM scratch
LABEL org.opencontainers.image.title="demo app" \\
      org.opencontainers.image.description="does \\"things\\", well" plain=word
# a comment between instructions
LABEL single="one more"
USER 65532:65532
EXPOSE 8443/tcp 8080 53/udp
ENTRYPOINT ["/usr/local/bin/app", "--flag"]
CMD ["run"]
COPY --from=build /app /usr/local/bin/app
COPY --from=build --chmod=0755 ["/a b", "/usr/local/bin/tool"]
COPY one two /dir/
"""

    def test_only_the_last_stage_counts(self) -> None:
        stage = parse_dockerfile(self.SAMPLE)
        self.assertEqual(stage.base, "scratch")
        self.assertEqual(stage.entrypoint, ["/usr/local/bin/app", "--flag"])
        self.assertEqual(stage.cmd, ["run"])
        self.assertEqual(stage.user, "65532:65532")
        self.assertNotIn("org.example.stage", stage.labels)

    def test_labels_several_pairs_and_quoted_values(self) -> None:
        self.assertEqual(parse_dockerfile(self.SAMPLE).labels, {
            "org.opencontainers.image.title": "demo app",
            "org.opencontainers.image.description": 'does "things", well',
            "plain": "word",
            "single": "one more",
        })

    def test_copy_flags_sources_and_dest(self) -> None:
        stage = parse_dockerfile(self.SAMPLE)
        self.assertEqual(stage.copies, [
            Copy(sources=["/app"], dest="/usr/local/bin/app", flags={"from": "build"}),
            Copy(sources=["/a b"], dest="/usr/local/bin/tool", flags={"from": "build", "chmod": "0755"}),
            Copy(sources=["one", "two"], dest="/dir/", flags={}),
        ])
        with self.assertRaises(ValueError):
            parse_dockerfile("FROM scratch\nCOPY --from=build /only\n")

    def test_expose_with_and_without_protocol(self) -> None:
        self.assertEqual(parse_dockerfile(self.SAMPLE).exposed, {"8443/tcp", "8080/tcp", "53/udp"})

    def test_shell_form_and_missing_from(self) -> None:
        stage = parse_dockerfile("FROM scratch\nCMD echo hi\n")
        self.assertEqual(stage.cmd, ["/bin/sh", "-c", "echo hi"])
        self.assertIsNone(stage.entrypoint)
        with self.assertRaises(ValueError):
            parse_dockerfile("LABEL a=b\n")

    def test_the_projects_dockerfile(self) -> None:
        with open(DOCKERFILE, encoding="utf-8") as f:
            stage = parse_dockerfile(f.read())
        self.assertEqual(stage.base, "gcr.io/distroless/static-debian12:nonroot")
        self.assertEqual([c.dest for c in stage.copies], ["/usr/local/bin/safe-termination", WAITER])
        self.assertEqual(stage.labels.get("org.opencontainers.image.licenses"), cargo_package()["license"])


if __name__ == "__main__":
    unittest.main()
