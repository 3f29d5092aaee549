#!/usr/bin/env python3
"""Join single-platform OCI image archives into one multi-platform image index (stdlib only).

`make image` writes one OCI image-layout tar for the machine's own platform
(image/build.sh, image/oci_image.py). A registry serves a multi-platform image as an
image INDEX (`application/vnd.oci.image.index.v1+json`) whose manifests each carry a
`platform`. This writes that index, and an OCI image layout DIRECTORY holding it with
every blob of the archives, which `crane push DIR REF` uploads as is (image/push-index.sh,
`make image-index`):

    oci_index.py platform ARCHIVE
        prints the archive's platform, OS/ARCH[/VARIANT], from its image config
    oci_index.py layout --out DIR --tag TAG [--platforms "linux/amd64 linux/arm64"] ARCHIVE...
        writes DIR (new or empty): oci-layout, blobs/sha256/*, and index.json naming one
        descriptor, the image index (annotation org.opencontainers.image.ref.name=TAG);
        prints the index's digest

Each archive must hold exactly one image manifest, and every blob it names (config,
layers) with the digest and size the manifest gives. The platform is the config's `os`,
`architecture` and `variant`; a platform on the archive's index.json descriptor must agree.
With --platforms the index lists exactly those, in that order (an archive of another
platform is left out; a platform with no archive is an error, exit 3, listing them);
without it, every archive's platform, sorted. Two archives of one platform are an error.

The index carries the annotations every manifest has with the same value (the
org.opencontainers.image.* labels image/build.sh gives: title, description, source,
licenses, version), which registries such as GHCR show for a multi-platform image.

Deterministic: JSON with sorted keys and no spaces (as oci_image.py writes), so the same
archives give the same index digest. Usage errors print one line `oci_index.py: error: ...`
and exit with code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import gzip
import io
import shutil
import sys
import tarfile
import zlib

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# what a Docker-built image may also use; accepted, kept as given
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


class UsageError(Exception):
    pass


class MissingPlatforms(Exception):
    def __init__(self, missing: list[str], have: list[str]):
        super().__init__(f"no archive for {' '.join(missing)} (the archives are {' '.join(have) or 'none'})")
        self.missing = missing


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def platform_str(p: dict) -> str:
    s = f"{p['os']}/{p['architecture']}"
    return s + (f"/{p['variant']}" if p.get("variant") else "")


class Archive:
    """One single-image OCI image-layout tar, checked blob by blob."""

    def __init__(self, path: str):
        self.path = path
        try:
            with tarfile.open(path) as tar:
                self.files = {}
                for m in tar.getmembers():
                    if m.isfile():
                        self.files[os.path.normpath(m.name)] = tar.extractfile(m).read()
        except (OSError, tarfile.TarError, EOFError) as e:
            raise UsageError(f"{path}: not a readable tar ({e})") from None
        layout = self.json_object("oci-layout", self.file("oci-layout"))
        if layout.get("imageLayoutVersion") != "1.0.0":
            raise UsageError(f"{path}: oci-layout is {layout!r}, not imageLayoutVersion 1.0.0")
        index = self.json_object("index.json", self.file("index.json"))
        manifests = index.get("manifests", [])
        if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
            n = len(manifests) if isinstance(manifests, list) else "no list of"
            raise UsageError(f"{path}: index.json lists {n} manifests, not one image")
        self.descriptor = manifests[0]
        if self.descriptor.get("mediaType") not in (MANIFEST, DOCKER_MANIFEST):
            raise UsageError(f"{path}: index.json names a {self.descriptor.get('mediaType')}, not an image manifest")
        self.manifest_bytes = self.blob(self.descriptor)
        self.manifest = self.json_object("the image manifest", self.manifest_bytes)
        if not isinstance(self.manifest.get("config"), dict) or not isinstance(self.manifest.get("layers", []), list):
            raise UsageError(f"{path}: the image manifest has no config descriptor or no list of layers")
        self.config = self.json_object("the image config", self.blob(self.manifest["config"]))
        # the blobs the manifest names: its config and its layers (each checked here)
        self.referenced = [self.manifest["config"], *self.manifest.get("layers", [])]
        for layer in self.manifest.get("layers", []):
            self.blob(layer)
        if not self.config.get("os") or not self.config.get("architecture"):
            raise UsageError(f"{path}: the image config names no os and architecture")
        self.platform = {"os": self.config["os"], "architecture": self.config["architecture"]}
        if self.config.get("variant"):
            self.platform["variant"] = self.config["variant"]
        given = self.descriptor.get("platform")
        if given is not None and platform_str(given) != platform_str(self.platform):
            raise UsageError(
                f"{path}: index.json says {platform_str(given)}, the image config {platform_str(self.platform)}"
            )

    def json_object(self, what: str, data: bytes) -> dict:
        """`data` parsed as a JSON object; anything else is a UsageError naming `what`."""
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise UsageError(f"{self.path}: {what} is not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{self.path}: {what} is a JSON {type(obj).__name__}, not an object")
        return obj

    def file(self, name: str) -> bytes:
        try:
            return self.files[name]
        except KeyError:
            raise UsageError(f"{self.path}: no {name}") from None

    def blob(self, desc: dict) -> bytes:
        digest, size = desc.get("digest"), desc.get("size")
        if not isinstance(digest, str) or not isinstance(size, int):
            raise UsageError(f"{self.path}: a descriptor without a digest string and an integer size: {desc!r}")
        algo, _, hexdigest = digest.partition(":")
        if algo != "sha256" or not hexdigest:
            raise UsageError(f"{self.path}: blob {digest}: only sha256 is supported")
        data = self.file(f"blobs/sha256/{hexdigest}")
        if len(data) != size:
            raise UsageError(f"{self.path}: blob {digest} has {len(data)} bytes, not the {size} its descriptor says")
        if sha256(data) != digest:
            raise UsageError(f"{self.path}: blob {digest} has the sha256 {sha256(data)}: its content is not what the descriptor names")
        return data

    def layer_file(self, path: str) -> bytes | None:
        """The regular file at `path` as the image's layers leave it (a later layer's file or
        whiteout overrides an earlier one's); None when there is none. A layer that is not a tar
        (gzip-compressed or not), or a non-regular file at `path`, is a UsageError."""
        name = os.path.normpath(path.lstrip("/"))
        parent, base = os.path.split(name)
        whiteout = os.path.join(parent, ".wh." + base)
        found: bytes | None = None
        for desc in self.manifest.get("layers", []):
            data = self.blob(desc)
            try:
                if str(desc.get("mediaType", "")).endswith("+gzip"):
                    data = gzip.decompress(data)
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    for m in tar.getmembers():
                        member = os.path.normpath(m.name.lstrip("/"))
                        if member == whiteout:
                            found = None
                        elif member == name:
                            if not m.isfile():
                                raise UsageError(f"{self.path}: {path} is not a regular file in the image")
                            found = tar.extractfile(m).read()
            except (OSError, EOFError, zlib.error, tarfile.TarError) as e:
                raise UsageError(f"{self.path}: layer {desc.get('digest')} is not a readable tar ({e})") from None
        return found

    def blobs(self) -> dict[str, bytes]:
        out = {self.descriptor["digest"]: self.manifest_bytes}
        for d in self.referenced:
            out[d["digest"]] = self.blob(d)
        return out


def build_index(archives: list[Archive], platforms: list[str] | None) -> tuple[bytes, list[Archive]]:
    by_platform: dict[str, Archive] = {}
    for a in archives:
        p = platform_str(a.platform)
        if p in by_platform:
            raise UsageError(f"{by_platform[p].path} and {a.path} are both {p}")
        by_platform[p] = a
    if platforms is None:
        platforms = sorted(by_platform)
    if len(set(platforms)) != len(platforms):
        raise UsageError(f"--platforms names a platform twice: {' '.join(platforms)}")
    missing = [p for p in platforms if p not in by_platform]
    if missing:
        raise MissingPlatforms(missing, sorted(by_platform))
    chosen = [by_platform[p] for p in platforms]
    if not chosen:
        raise UsageError("no platform to index")
    common = dict(chosen[0].manifest.get("annotations", {}))
    for a in chosen[1:]:
        mine = a.manifest.get("annotations", {})
        common = {k: v for k, v in common.items() if mine.get(k) == v}
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {
                "mediaType": a.descriptor["mediaType"],
                "digest": a.descriptor["digest"],
                "size": a.descriptor["size"],
                "platform": a.platform,
            }
            for a in chosen
        ],
    }
    if common:
        index["annotations"] = common
    return canonical(index), chosen


def write_layout(out: str, index_bytes: bytes, chosen: list[Archive], tag: str) -> None:
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UsageError(f"--out {out!r} exists and is not an empty directory")
    tmp = f"{out.rstrip('/')}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.join(tmp, "blobs", "sha256"))
        blobs = {sha256(index_bytes): index_bytes}
        for a in chosen:
            blobs.update(a.blobs())
        for digest, data in sorted(blobs.items()):
            with open(os.path.join(tmp, "blobs", "sha256", digest.split(":", 1)[1]), "wb") as f:
                f.write(data)
        with open(os.path.join(tmp, "oci-layout"), "wb") as f:
            f.write(canonical({"imageLayoutVersion": "1.0.0"}))
        layout_index = {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": INDEX,
                    "digest": sha256(index_bytes),
                    "size": len(index_bytes),
                    "annotations": {"org.opencontainers.image.ref.name": tag},
                }
            ],
        }
        with open(os.path.join(tmp, "index.json"), "wb") as f:
            f.write(canonical(layout_index))
        if os.path.isdir(out):
            os.rmdir(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="oci_index.py", description="Join single-platform OCI image archives into one image index.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    plat = sub.add_parser("platform", help="print an archive's OS/ARCH[/VARIANT]")
    plat.add_argument("archive")
    lay = sub.add_parser("layout", help="write an OCI image layout directory holding the index; print its digest")
    lay.add_argument("--out", required=True, help="directory to write (new or empty)")
    lay.add_argument("--tag", required=True, help="the layout's ref name for the index (the tag it is pushed as)")
    lay.add_argument("--platforms", help='space-separated OS/ARCH[/VARIANT] the index lists, in order, e.g. "linux/amd64 linux/arm64"')
    lay.add_argument("archives", nargs="+", metavar="ARCHIVE")
    return p


def main(argv: list[str]) -> int:
    try:
        args = make_parser().parse_args(argv)
        if args.command == "platform":
            print(platform_str(Archive(args.archive).platform))
            return 0
        archives = [Archive(a) for a in args.archives]
        platforms = args.platforms.split() if args.platforms is not None else None
        index_bytes, chosen = build_index(archives, platforms)
        write_layout(args.out, index_bytes, chosen, args.tag)
    except MissingPlatforms as e:
        print(f"oci_index.py: {e}", file=sys.stderr)
        return 3
    except UsageError as e:
        print(f"oci_index.py: error: {e}", file=sys.stderr)
        return 2
    left_out = [a.path for a in archives if a not in chosen]
    print(
        f"oci_index.py: wrote {args.out}: index {sha256(index_bytes)} "
        f"({', '.join(platform_str(a.platform) + ' ' + a.descriptor['digest'] for a in chosen)})"
        + (f"; left out {' '.join(left_out)} (not in --platforms)" if left_out else ""),
        file=sys.stderr,
    )
    print(sha256(index_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
