"""The Rust crates compiled into a binary, as cargo-auditable records them: an ELF section named
`.dep-v0` holding zlib-compressed JSON ({"packages": [{"name", "version", "source", "kind"?}]}).
Standard library only: image_contents runs this module's source in the image's own Python, to find
the binaries without copying the image's files out."""

from __future__ import annotations

import json
import struct
import zlib
from typing import BinaryIO

SECTION = b".dep-v0"
MAGIC = b"\x7fELF"
# e_ident[EI_CLASS] (32 or 64 bits) -> offsets of e_shoff and e_shentsize, e_shoff's format, and a
# section header's fields from sh_name to sh_size (elf(5))
LAYOUT = {1: (0x20, 0x2E, "I", "IIIIII"), 2: (0x28, 0x3A, "Q", "IIQQQQ")}


def section(f: BinaryIO, name: bytes = SECTION) -> bytes | None:
    """The bytes of an ELF file's section `name`; None when f is no ELF file or has no such
    section. A file that says it is ELF but whose headers do not fit in it is a ValueError."""
    f.seek(0)
    ident = f.read(16)
    if ident[:4] != MAGIC:
        return None
    if ident[4] not in LAYOUT or ident[5] not in (1, 2):
        raise ValueError(f"ELF class {ident[4]} or data encoding {ident[5]} is not one of ELF's")
    end = "<" if ident[5] == 1 else ">"
    shoff_at, shentsize_at, word, fields = LAYOUT[ident[4]]

    def unpack(fmt: str, offset: int) -> tuple:
        f.seek(offset)
        data = f.read(struct.calcsize(end + fmt))
        if len(data) < struct.calcsize(end + fmt):
            raise ValueError(f"truncated ELF file: {struct.calcsize(end + fmt)} bytes wanted at offset {offset}")
        return struct.unpack(end + fmt, data)

    (shoff,) = unpack(word, shoff_at)
    shentsize, shnum, shstrndx = unpack("HHH", shentsize_at)
    if shoff == 0 or shnum == 0:
        return None  # no section headers (stripped of them, or more than 0xff00: not a binary we read)

    def header(index: int) -> tuple[int, int, int]:
        sh_name, sh_type, _flags, _addr, offset, size = unpack(fields, shoff + index * shentsize)
        return sh_name, offset, size

    def read(offset: int, size: int) -> bytes:
        f.seek(offset)
        data = f.read(size)
        if len(data) < size:
            raise ValueError(f"truncated ELF file: a section of {size} bytes at offset {offset}")
        return data

    names = read(*header(shstrndx)[1:])
    for index in range(shnum):
        sh_name, offset, size = header(index)
        if names[sh_name : names.find(b"\0", sh_name)] == name:
            return read(offset, size)
    return None


def crates(data: bytes) -> list[dict]:
    """The crates a `.dep-v0` section records that are compiled into the binary: every package but
    build-time ones (kind "build": build scripts and proc macros' dependencies run at build time)."""
    try:
        document = json.loads(zlib.decompress(data))
        packages = document["packages"]
        return [
            {"name": p["name"], "version": p["version"], "source": p.get("source", "")}
            for p in packages
            if p.get("kind", "runtime") != "build"
        ]
    except (zlib.error, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not cargo-auditable data (zlib-compressed JSON with a packages list): {e}") from None
