#!/usr/bin/env python3
"""Write a single-layer OCI image as an image-layout tarball (stdlib only).

There is no registry and no Docker in the e2e cluster: images are written as
OCI image layouts (https://github.com/opencontainers/image-spec/blob/main/image-layout.md)
packed in a tar and imported on each node with

    ctr -n k8s.io images import FILE.tar

The tar holds `oci-layout`, `index.json` (one manifest) and
`blobs/sha256/<digest>` for the config, the manifest and ONE gzip-compressed
layer (`application/vnd.oci.image.layer.v1.tar+gzip`) with the added files and
their parent directories.

Image name. The index descriptor carries two annotations:

- `io.containerd.image.name` = the NORMALISED name (the rules of
  `reference.ParseDockerRef`: a first path component without `.` or `:` and
  not `localhost` gets `docker.io/`, a single component also `library/`, a
  missing tag becomes `:latest`). containerd 2.x's `ctr images import` stores
  this annotation verbatim as the image name (it does NOT normalise it), while
  the CRI plugin (the kubelet) looks images up by their normalised name; so the
  normalised form is what makes a pod's `image:` match. `st.local/pause:1`
  stays `st.local/pause:1` (`st.local` contains a dot: it is a registry host);
  `pause:1` would become `docker.io/library/pause:1`.
- `org.opencontainers.image.ref.name` = the tag (as the image-layout spec
  describes it; containerd only uses it when the annotation above is absent).

A pod spec refers to the image by the name given to --name (or its normalised
form, they are equivalent for the kubelet), e.g. `image: st.local/testapp:1`,
with `imagePullPolicy: Never` (nothing can be pulled; with `IfNotPresent`, the
default for a non-`latest` tag, a missing image also fails only after a pull
attempt).

Deterministic: entries sorted, mtime 0, uid/gid from --owner (default 0:0) or
--chown (one entry's own, e.g. a non-root home directory),
no user/group names, gzip mtime 0, JSON with sorted keys: the same inputs give
byte-identical tarballs and digests.

Usage errors (missing file, bad --add syntax, duplicate destination...) print
one line `oci_image.py: error: ...` and exit with code 2.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import stat
import sys
import tarfile
from dataclasses import dataclass

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
# gzip level of the layer (any level is deterministic for a given zlib)
GZIP_LEVEL = 6


class UsageError(Exception):
    """A problem with the arguments or inputs: reported in one line, exit 2."""


@dataclass
class Entry:
    """One entry of the layer."""

    path: str  # relative, no leading or trailing '/'
    kind: str  # "file" or "dir"
    mode: int
    data: bytes = b""
    explicit: bool = True  # given by the user (not an implied parent dir)


# --- argument parsing ----------------------------------------------------


def parse_mode(text: str, what: str) -> int:
    """Parses an octal mode such as 0755, 755 or 1777."""
    if not re.fullmatch(r"0?[0-7]{3,4}", text):
        raise UsageError(f"{what}: mode {text!r} is not an octal mode like 0755")
    mode = int(text, 8)
    if mode > 0o7777:
        raise UsageError(f"{what}: mode {text!r} is out of range")
    return mode


def norm_dest(dest: str, what: str) -> str:
    """Validates an absolute destination path; returns it without the leading '/'."""
    if not dest.startswith("/"):
        raise UsageError(f"{what}: destination {dest!r} must be an absolute path")
    parts = [p for p in dest.split("/") if p]
    if not parts:
        raise UsageError(f"{what}: destination {dest!r} is the root directory")
    if any(p in (".", "..") for p in parts):
        raise UsageError(f"{what}: destination {dest!r} must not contain '.' or '..'")
    return "/".join(parts)


def parse_add(spec: str) -> tuple[str, str, int | None]:
    """SRC:DEST[:MODE] -> (src, dest, mode or None)."""
    what = f"--add {spec!r}"
    parts = spec.split(":")
    mode = None
    if len(parts) == 3:
        mode = parse_mode(parts[2], what)
    elif len(parts) != 2:
        raise UsageError(f"{what}: expected SRC:DEST[:MODE] (paths must not contain ':')")
    src, dest = parts[0], parts[1]
    if not src or not dest:
        raise UsageError(f"{what}: expected SRC:DEST[:MODE] with a non-empty SRC and DEST")
    return src, norm_dest(dest, what), mode


def parse_dir(spec: str) -> tuple[str, int]:
    """DEST[:MODE] -> (dest, mode)."""
    what = f"--add-dir-empty {spec!r}"
    dest, sep, mode_text = spec.partition(":")
    mode = parse_mode(mode_text, what) if sep else DEFAULT_DIR_MODE
    return norm_dest(dest, what), mode


def unescape(text: str, what: str) -> bytes:
    """Interprets \\n, \\t, \\\\ and \\xHH in a --add-text content."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt == "n":
            out += b"\n"
        elif nxt == "t":
            out += b"\t"
        elif nxt == "\\":
            out += b"\\"
        elif nxt == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 2 : i + 4]):
            out.append(int(text[i + 2 : i + 4], 16))
            i += 2
        else:
            raise UsageError(f"{what}: unsupported escape {text[i:i + 2]!r} (use \\n, \\t, \\\\, \\xHH)")
        i += 2
    return bytes(out)


def parse_text(spec: str) -> tuple[str, bytes]:
    """DEST:CONTENT (content may contain ':'; escapes interpreted) -> (dest, bytes)."""
    what = f"--add-text {spec!r}"
    dest, sep, content = spec.partition(":")
    if not sep:
        raise UsageError(f"{what}: expected DEST:CONTENT")
    return norm_dest(dest, what), unescape(content, what)


def parse_json_list(text: str, flag: str) -> list[str]:
    """A JSON array of strings, e.g. ["/st-testapp","serve"]."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag} {text!r}: not JSON ({e.msg})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{flag} {text!r}: expected a JSON array of strings")
    return value


def parse_kv(spec: str, flag: str) -> tuple[str, str]:
    """K=V -> (K, V)."""
    key, sep, value = spec.partition("=")
    if not sep or not key:
        raise UsageError(f"{flag} {spec!r}: expected KEY=VALUE")
    return key, value


def parse_port(spec: str) -> str:
    """8080, 8080/tcp or 53/udp -> '8080/tcp' style."""
    m = re.fullmatch(r"(\d{1,5})(?:/(tcp|udp|sctp))?", spec)
    if not m or not 0 < int(m.group(1)) < 65536:
        raise UsageError(f"--expose {spec!r}: expected PORT[/tcp|/udp|/sctp]")
    return f"{int(m.group(1))}/{m.group(2) or 'tcp'}"


def parse_owner(spec: str) -> tuple[int, int]:
    """UID:GID -> (uid, gid)."""
    m = re.fullmatch(r"(\d+):(\d+)", spec)
    if not m:
        raise UsageError(f"--owner {spec!r}: expected numeric UID:GID")
    return int(m.group(1)), int(m.group(2))


def parse_platform(spec: str) -> dict:
    """os/arch[/variant] -> OCI platform object."""
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"--platform {spec!r}: expected OS/ARCH[/VARIANT], e.g. linux/amd64")
    platform = {"architecture": parts[1], "os": parts[0]}
    if len(parts) == 3:
        platform["variant"] = parts[2]
    return platform


_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"


def normalize_name(name: str) -> tuple[str, str]:
    """NAME[:TAG] -> (normalised full name, tag), as containerd/CRI do
    (distribution reference.ParseDockerRef; digests are not supported here)."""
    what = f"--name {name!r}"
    if "@" in name:
        raise UsageError(f"{what}: a digest cannot be given, the image's digest is computed")
    repo, tag = name, "latest"
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = name.rsplit(":", 1)
    if not re.fullmatch(_TAG, tag):
        raise UsageError(f"{what}: invalid tag {tag!r}")
    first, sep, rest = repo.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
        if not re.fullmatch(_DOMAIN, domain):
            raise UsageError(f"{what}: invalid registry host {domain!r}")
    else:
        domain, path = "docker.io", repo
        if "/" not in path:
            path = "library/" + path
    if not all(re.fullmatch(_NAME_COMPONENT, c) for c in path.split("/")):
        raise UsageError(f"{what}: invalid repository path {path!r} (lowercase letters, digits, separators . _ __ -)")
    return f"{domain}/{path}:{tag}", tag


# --- layer -----------------------------------------------------------------


def collect_entries(args: argparse.Namespace) -> list[Entry]:
    """All layer entries (explicit ones plus implied parent directories), sorted."""
    entries: dict[str, Entry] = {}

    def put(entry: Entry, what: str) -> None:
        if entry.path in entries:
            raise UsageError(f"{what}: destination /{entry.path} is given twice")
        entries[entry.path] = entry

    for spec in args.add:
        src, dest, mode = parse_add(spec)
        what = f"--add {spec!r}"
        if not os.path.exists(src):
            raise UsageError(f"{what}: source file {src!r} does not exist")
        if os.path.isdir(src):
            put(Entry(dest, "dir", mode if mode is not None else DEFAULT_DIR_MODE), what)
            for root, dirs, files in os.walk(src):
                dirs.sort()
                rel_root = os.path.relpath(root, src)
                for d in dirs:
                    full = os.path.join(root, d)
                    rel = os.path.normpath(os.path.join(rel_root, d))
                    put(Entry(f"{dest}/{rel}", "dir", stat.S_IMODE(os.stat(full).st_mode)), what)
                for f in sorted(files):
                    full = os.path.join(root, f)
                    rel = os.path.normpath(os.path.join(rel_root, f))
                    put(Entry(f"{dest}/{rel}", "file", stat.S_IMODE(os.stat(full).st_mode), read_file(full, what)), what)
            continue
        if not os.path.isfile(src):
            raise UsageError(f"{what}: source {src!r} is not a regular file")
        file_mode = mode if mode is not None else stat.S_IMODE(os.stat(src).st_mode)
        put(Entry(dest, "file", file_mode, read_file(src, what)), what)

    for spec in args.add_text:
        dest, data = parse_text(spec)
        put(Entry(dest, "file", DEFAULT_FILE_MODE, data), f"--add-text {spec!r}")

    for spec in args.add_dir_empty:
        dest, mode = parse_dir(spec)
        put(Entry(dest, "dir", mode), f"--add-dir-empty {spec!r}")

    if not entries:
        raise UsageError("nothing to put in the image: give at least one --add, --add-text or --add-dir-empty")

    # Implied parent directories; a file cannot be the parent of something.
    for path in list(entries):
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            existing = entries.get(parent)
            if existing is None:
                entries[parent] = Entry(parent, "dir", DEFAULT_DIR_MODE, explicit=False)
            elif existing.kind != "dir":
                raise UsageError(f"/{parent} is a file but /{path} needs it to be a directory")
    return [entries[p] for p in sorted(entries)]


def read_file(path: str, what: str) -> bytes:
    """Reads a source file, turning OS errors into usage errors."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"{what}: cannot read {path!r}: {e.strerror}") from None


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A deterministic tar of the given members (in the given order)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def tar_info(name: str, kind: str, mode: int, size: int, uid: int, gid: int) -> tarfile.TarInfo:
    """A TarInfo with every varying field fixed."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if kind == "dir" else tarfile.REGTYPE
    info.mode = mode
    info.size = size if kind == "file" else 0
    info.mtime = 0
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    return info


def parse_chown(spec: str) -> tuple[str, tuple[int, int]]:
    """/DEST:UID:GID -> (the layer path, (uid, gid))."""
    m = re.fullmatch(r"(/[^:]*):(\d+):(\d+)", spec)
    if not m:
        raise UsageError(f"--chown {spec!r}: expected /DEST:UID:GID with a numeric UID and GID")
    return norm_dest(m.group(1), f"--chown {spec!r}"), (int(m.group(2)), int(m.group(3)))


def build_layer(entries: list[Entry], uid: int, gid: int, owners: dict[str, tuple[int, int]] | None = None) -> bytes:
    """The uncompressed layer tar: every entry owned by uid:gid, but those named in `owners`
    (layer path -> (uid, gid)), each of which must be in the layer."""
    owners = owners or {}
    missing = sorted(set(owners) - {e.path for e in entries})
    if missing:
        raise UsageError(f"--chown: /{missing[0]} is not in the layer")
    members = []
    for e in entries:
        name = e.path + "/" if e.kind == "dir" else e.path
        e_uid, e_gid = owners.get(e.path, (uid, gid))
        members.append((tar_info(name, e.kind, e.mode, len(e.data), e_uid, e_gid), e.data if e.kind == "file" else None))
    return tar_bytes(members)


# --- image -----------------------------------------------------------------


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_image(args: argparse.Namespace) -> tuple[bytes, dict]:
    """Returns (the OCI layout tar, a summary)."""
    full_name, tag = normalize_name(args.name)
    platform = parse_platform(args.platform)
    uid, gid = parse_owner(args.owner)
    entrypoint = parse_json_list(args.entrypoint, "--entrypoint") if args.entrypoint is not None else None
    cmd = parse_json_list(args.cmd, "--cmd") if args.cmd is not None else None
    env = [f"{k}={v}" for k, v in (parse_kv(s, "--env") for s in args.env)]
    if not any(e.startswith("PATH=") for e in env):
        env.insert(0, DEFAULT_PATH)
    labels = dict(parse_kv(s, "--label") for s in args.label)
    ports = {parse_port(p): {} for p in args.expose}
    if args.user is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)?", args.user):
        raise UsageError(f"--user {args.user!r}: expected USER[:GROUP] (names or numbers)")
    if args.workdir is not None and not args.workdir.startswith("/"):
        raise UsageError(f"--workdir {args.workdir!r}: must be an absolute path")

    entries = collect_entries(args)
    owners = dict(parse_chown(c) for c in args.chown)
    layer = build_layer(entries, uid, gid, owners)
    layer_gz = gzip.compress(layer, compresslevel=GZIP_LEVEL, mtime=0)

    exec_config: dict = {"Env": env}
    if entrypoint is not None:
        exec_config["Entrypoint"] = entrypoint
    if cmd is not None:
        exec_config["Cmd"] = cmd
    if args.user is not None:
        exec_config["User"] = args.user
    if labels:
        exec_config["Labels"] = labels
    if ports:
        exec_config["ExposedPorts"] = ports
    if args.workdir is not None:
        exec_config["WorkingDir"] = args.workdir
    config = {
        **platform,
        "created": "1970-01-01T00:00:00Z",
        "config": exec_config,
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer)]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "image/oci_image.py"}],
    }
    config_bytes = canonical_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": sha256(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER_GZIP, "digest": sha256(layer_gz), "size": len(layer_gz)}],
    }
    if labels:
        manifest["annotations"] = dict(labels)
    manifest_bytes = canonical_json(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": sha256(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": platform,
                "annotations": {ANNOTATION_CONTAINERD_NAME: full_name, ANNOTATION_REF_NAME: tag},
            }
        ],
    }
    index_bytes = canonical_json(index)
    oci_layout = canonical_json({"imageLayoutVersion": "1.0.0"})

    blobs = sorted({sha256(b): b for b in (config_bytes, manifest_bytes, layer_gz)}.items())
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (tar_info("oci-layout", "file", 0o644, len(oci_layout), 0, 0), oci_layout),
        (tar_info("index.json", "file", 0o644, len(index_bytes), 0, 0), index_bytes),
        (tar_info("blobs/", "dir", 0o755, 0, 0, 0), None),
        (tar_info("blobs/sha256/", "dir", 0o755, 0, 0, 0), None),
    ]
    for digest, data in blobs:
        hex_digest = digest.split(":", 1)[1]
        members.append((tar_info(f"blobs/sha256/{hex_digest}", "file", 0o644, len(data), 0, 0), data))
    summary = {
        "name": full_name,
        "manifest": sha256(manifest_bytes),
        "config": sha256(config_bytes),
        "layer": sha256(layer_gz),
        "entries": len(entries),
    }
    return tar_bytes(members), summary


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def make_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="oci_image.py",
        description="Write a single-layer OCI image layout tarball for `ctr images import` (deterministic).",
    )
    p.add_argument("--out", required=True, help="output tarball (written atomically)")
    p.add_argument("--name", required=True, help="image NAME[:TAG], e.g. st.local/testapp:1 (see the module docs)")
    p.add_argument("--add", action="append", default=[], metavar="SRC:DEST[:MODE]",
                   help="add a file (or a directory tree) at absolute DEST; MODE octal, default: the source's")
    p.add_argument("--add-text", action="append", default=[], metavar="DEST:CONTENT",
                   help="add a file (mode 0644) with CONTENT; \\n \\t \\\\ \\xHH are interpreted")
    p.add_argument("--add-dir-empty", action="append", default=[], metavar="DEST[:MODE]",
                   help="add an empty directory, e.g. /tmp:1777 (default mode 0755)")
    p.add_argument("--entrypoint", help='JSON array, e.g. \'["/st-testapp","serve"]\'')
    p.add_argument("--cmd", help="JSON array")
    p.add_argument("--user", help="USER[:GROUP], e.g. 65532:65532")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help=f"environment (default {DEFAULT_PATH} unless PATH is given)")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="config label (also a manifest annotation)")
    p.add_argument("--expose", action="append", default=[], metavar="PORT[/PROTO]", help="exposed port, e.g. 8080/tcp")
    p.add_argument("--workdir", help="working directory (absolute)")
    p.add_argument("--owner", default="0:0", help="UID:GID of every layer entry (default 0:0)")
    p.add_argument("--chown", action="append", default=[], metavar="/DEST:UID:GID",
                   help="this entry's own owner instead of --owner (repeatable), e.g. /home/nonroot:65532:65532")
    p.add_argument("--platform", default="linux/amd64", help="OS/ARCH[/VARIANT] (default linux/amd64)")
    return p


def main(argv: list[str]) -> int:
    try:
        args = make_parser().parse_args(argv)
        data, summary = build_image(args)
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise UsageError(f"--out {args.out!r}: directory {out_dir!r} does not exist")
        tmp = f"{args.out}.tmp.{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, args.out)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            print(f"oci_image.py: cannot write {args.out!r}: {e.strerror}", file=sys.stderr)
            return 1
    except UsageError as e:
        print(f"oci_image.py: error: {e}", file=sys.stderr)
        return 2
    print(
        f"oci_image.py: wrote {args.out} name={summary['name']} manifest={summary['manifest']} "
        f"layer={summary['layer']} entries={summary['entries']} bytes={len(data)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
