"""Just enough of an ELF reader for ``packkit info``: a shared library's ``.comment`` (the compilers that
built it), its ``DT_NEEDED`` libraries, run paths and the symbol versions it needs (``.gnu.version_r``:
GLIBC_2.31, GLIBCXX_3.4.28, ...: the oldest glibc / libstdc++ it loads with). No binutils needed on the
user's machine."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29
_SHT_GNU_VERNEED = 0x6FFFFFFE


class ElfInfo(NamedTuple):
    comment: list[str]  # e.g. ["GCC: (Debian 12.2.0-14+deb12u1) 12.2.0"]
    needed: list[str]  # DT_NEEDED, in order
    runpath: list[str]  # DT_RUNPATH / DT_RPATH entries
    versions: dict[str, list[str]] = {}  # library -> the symbol versions needed from it, e.g. GLIBC_2.29


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
    versions: dict[str, list[str]] = {}
    for _name, typ, offset, _size, link in sections:
        if typ != _SHT_GNU_VERNEED:
            continue
        strtab = sections[link][2]
        pos = offset
        while True:  # Elf64_Verneed entries, each with a chain of Elf64_Vernaux
            _ver, count, file, aux, nxt = struct.unpack_from("<HHIII", data, pos)
            names, apos = versions.setdefault(_cstr(data, strtab + file), []), pos + aux
            for _ in range(count):
                _hash, _flags, _other, name, anext = struct.unpack_from("<IHHII", data, apos)
                names.append(_cstr(data, strtab + name))
                apos += anext
            if not nxt:
                break
            pos += nxt
    return ElfInfo(list(dict.fromkeys(comment)), needed, runpath, versions)


def newest_versions(versions: dict[str, list[str]]) -> dict[str, str]:
    """The newest version needed per family (``GLIBC``, ``GLIBCXX``, ``CXXABI``, ``GCC``), e.g.
    ``{"GLIBC": "2.31", "GLIBCXX": "3.4.28"}``: what the target machine's glibc and libstdc++ must provide."""
    newest: dict[str, tuple] = {}
    for names in versions.values():
        for v in names:
            family, _, number = v.partition("_")
            if not number or not all(part.isdigit() for part in number.split(".")):
                continue  # e.g. GLIBC_PRIVATE, CXXABI_FLOAT128: no ordering
            key = tuple(int(part) for part in number.split("."))
            if key > newest.get(family, ()):
                newest[family] = key
    return {family: ".".join(map(str, key)) for family, key in sorted(newest.items())}


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
