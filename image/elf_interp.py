#!/usr/bin/env python3
"""Print the ELF interpreter (PT_INTERP: the dynamic loader) a binary asks for; nothing for a
static binary. Exit 1 with a message when the file is not a 64-bit ELF. Also the one reader of
the ELF header's identification and machine for the image scripts (image/run_binary.py).

    python3 image/elf_interp.py BINARY

Used by image/build.sh and `make static`: ldd cannot tell, since glibc's ldd prints no "=>"
for a dynamically linked musl binary (as `RUSTFLAGS=-C target-feature=-crt-static` builds it).
"""

import struct
import sys

PT_INTERP = 3


def byte_order(head: bytes, what: str) -> str:
    """The struct byte order ("<" or ">") of a 64-bit ELF file from its first 64 bytes (ELF
    gABI e_ident: magic, EI_CLASS 2 for 64-bit, EI_DATA 1 for little-endian). ValueError naming
    `what` when `head` is not that."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
        raise ValueError(f"{what}: not a 64-bit ELF file")
    return "<" if head[5] == 1 else ">"


def machine(head: bytes, what: str) -> int:
    """e_machine of a 64-bit ELF file (ELF gABI: 16 bits at offset 18, in the file's byte order):
    62 for x86_64, 183 for aarch64. ValueError as byte_order."""
    (value,) = struct.unpack(byte_order(head, what) + "H", head[18:20])
    return value


def interpreter(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(64)
        end = byte_order(head, path)
        (phoff,) = struct.unpack(end + "Q", head[32:40])
        phentsize, phnum = struct.unpack(end + "HH", head[54:58])
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ph = f.read(phentsize)
            (p_type,) = struct.unpack(end + "I", ph[:4])
            if p_type == PT_INTERP:
                (offset,) = struct.unpack(end + "Q", ph[8:16])
                (size,) = struct.unpack(end + "Q", ph[32:40])
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode(errors="replace")
    return ""


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: elf_interp.py BINARY")
    try:
        print(interpreter(sys.argv[1]))
    except (OSError, ValueError, struct.error) as e:
        sys.exit(str(e))
