#!/usr/bin/env python3
"""e2e/oci-image.py plus per-path owners (stdlib only).

    image/pack.py --chown /home/nonroot:65532:65532 [every oci-image.py argument]

oci-image.py gives every layer entry one owner (--owner, default 0:0). The
operator image needs one exception, as in distroless/static:nonroot: the home
directory /home/nonroot belongs to 65532:65532, everything else to root. This
wrapper loads oci-image.py as a module, replaces its build_layer with one that
gives the entries named by --chown DEST:UID:GID (repeatable) their own owner,
and runs oci-image.py's main with the other arguments: the same deterministic
output, the same messages and exit codes. A --chown path that is not in the
layer is a usage error (exit 2).
"""

from __future__ import annotations

import importlib
import os
import re
import sys

E2E = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "e2e")


def load_writer():
    """e2e/oci-image.py as a module (import_module takes the name an import statement cannot)."""
    sys.path.insert(0, E2E)
    return importlib.import_module("oci-image")


def split_chown(argv: list[str], writer) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Takes the --chown DEST:UID:GID arguments out of argv -> ({path: (uid, gid)}, the rest)."""
    owners: dict[str, tuple[int, int]] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--chown":
            spec = next(args, None)
            if spec is None:
                raise writer.UsageError("--chown: expected DEST:UID:GID")
        elif arg.startswith("--chown="):
            spec = arg.split("=", 1)[1]
        else:
            rest.append(arg)
            continue
        m = re.fullmatch(r"(/[^:]*):(\d+):(\d+)", spec)
        if not m:
            raise writer.UsageError(f"--chown {spec!r}: expected /DEST:UID:GID with a numeric UID and GID")
        owners[writer.norm_dest(m.group(1), f"--chown {spec!r}")] = (int(m.group(2)), int(m.group(3)))
    return owners, rest


def main(argv: list[str]) -> int:
    writer = load_writer()
    try:
        owners, rest = split_chown(argv, writer)
    except writer.UsageError as e:
        print(f"pack.py: error: {e}", file=sys.stderr)
        return 2

    def build_layer(entries, uid: int, gid: int) -> bytes:
        missing = sorted(set(owners) - {e.path for e in entries})
        if missing:
            raise writer.UsageError(f"--chown: /{missing[0]} is not in the layer")
        members = []
        for e in entries:
            e_uid, e_gid = owners.get(e.path, (uid, gid))
            name = e.path + "/" if e.kind == "dir" else e.path
            data = e.data if e.kind == "file" else None
            members.append((writer.tar_info(name, e.kind, e.mode, len(e.data), e_uid, e_gid), data))
        return writer.tar_bytes(members)

    writer.build_layer = build_layer
    return writer.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
