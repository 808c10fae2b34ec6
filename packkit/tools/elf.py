"""Just enough of an ELF reader for ``packkit info``: a shared library's ``.comment`` (the compilers that
built it), its ``DT_NEEDED`` libraries and run paths. No binutils needed on the user's machine."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29


class ElfInfo(NamedTuple):
    comment: list[str]  # e.g. ["GCC: (Debian 12.2.0-14+deb12u1) 12.2.0"]
    needed: list[str]  # DT_NEEDED, in order
    runpath: list[str]  # DT_RUNPATH / DT_RPATH entries


def read_elf(path: str | Path) -> ElfInfo:
    """Reads a 64-bit little-endian ELF file (what Linux x86-64 and aarch64 use); raises ValueError otherwise."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        name, typ, _flags, _addr, offset, size, link = struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize)
        sections.append((name, typ, offset, size, link))
    names_offset = sections[shstrndx][2]

    def section_name(s):
        return _cstr(data, names_offset + s[0])

    by_name = {section_name(s): s for s in sections}
    comment = []
    if ".comment" in by_name:
        _, _, offset, size, _ = by_name[".comment"]
        comment = [c.decode(errors="replace") for c in data[offset:offset + size].split(b"\0") if c]
    needed, runpath = [], []
    if ".dynamic" in by_name:
        _, _, offset, size, link = by_name[".dynamic"]
        strtab = sections[link][2]
        for pos in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                needed.append(_cstr(data, strtab + value))
            elif tag in (_DT_RPATH, _DT_RUNPATH):
                runpath.extend(_cstr(data, strtab + value).split(":"))
    return ElfInfo(list(dict.fromkeys(comment)), needed, runpath)


def _cstr(data: bytes, offset: int) -> str:
    return data[offset:data.index(b"\0", offset)].decode(errors="replace")


def mapped_libraries(*names: str) -> dict[str, list[str]]:
    """The files of this process's memory map whose name starts with one of ``names`` (e.g. ``libstdc++``),
    resolved to their real path: which C++ runtime a crashing process really uses, and whether two are
    loaded. Empty lists where /proc/self/maps is not readable."""
    found: dict[str, list[str]] = {n: [] for n in names}
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6:
            continue
        path = parts[5]
        base = path.rsplit("/", 1)[-1]
        for n in names:
            if base.startswith(n):
                real = str(Path(path).resolve())
                if real not in found[n]:
                    found[n].append(real)
    return found
