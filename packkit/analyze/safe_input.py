"""Reading input files safely: regular files only, bounded reads, clear errors for hostile files.

* only regular files (and folders of saved datasets) are read: a FIFO, device or socket is refused
  before it is opened, and files are opened with ``O_NONBLOCK`` so a file swapped for a FIFO after
  the check cannot block either;
* one line (JSON Lines, text of lengths) is read with at most ``MAX_LINE_BYTES + 1`` bytes, and a JSON
  document holds at most ``MAX_DOCUMENT_BYTES``: memory stays bounded on a huge single-line file;
* gzip that ends early or is corrupt becomes an :class:`AnalyzeError`, not an ``EOFError`` traceback;
* :class:`Snapshot` compares the file's identity, size and mtime before and after reading: a file
  that changed while being read is an error, not silently mixed data.
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import io
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import AnalyzeError

MAX_LINE_BYTES = 128 << 20  # one JSON Lines record or one line of a text file
MAX_DOCUMENT_BYTES = 512 << 20  # a whole .json document (parsed at once; use JSON Lines for more)

_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def input_stat(path: Path) -> os.stat_result:
    """``os.stat(path)`` of a regular file or a folder; an AnalyzeError for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise AnalyzeError("no such file or directory", path) from None
    except OSError as e:
        problem = "too many levels of symbolic links" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise AnalyzeError(f"cannot read: {problem}", path) from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return st
    kind = next((name for test, name in _SPECIAL if test(st.st_mode)), "not a regular file")
    raise AnalyzeError(f"{kind}, not a regular file: packkit analyze reads only regular files and folders of "
                       "saved datasets", path)


@dataclass(frozen=True)
class Snapshot:
    """Identity, size and modification time of an input file, to tell whether it changed while read."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> "Snapshot":
        st = input_stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def check(self, path: Path) -> None:
        """Raises AnalyzeError when ``path`` is no longer the file this snapshot was taken of."""
        try:
            now = Snapshot.of(path)
        except AnalyzeError as e:
            raise AnalyzeError(f"the file changed while being read ({e.problem})", path) from None
        if now != self:
            what = "was replaced" if (now.dev, now.ino) != (self.dev, self.ino) else (
                f"size {self.size} -> {now.size} bytes" if now.size != self.size else "modified")
            raise AnalyzeError(f"the file changed while being read ({what}); read it again once it is complete",
                               path)


def _open_regular(path: Path):
    """A buffered binary file of a regular file, opened without blocking (a FIFO swapped in is refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise AnalyzeError(f"cannot open: {e.strerror or e}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            input_stat(path)  # names the kind of special file
            raise AnalyzeError("not a regular file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def open_input(path: Path):
    """The (decompressed, for ``.gz``) bytes of a regular input file; gzip errors become AnalyzeErrors."""
    raw = _open_regular(path)
    try:
        if path.suffix == ".gz":
            with gzip_errors(path):
                yield gzip.GzipFile(fileobj=raw, mode="rb")
        else:  # an EOFError here (e.g. from np.load) is not about gzip
            yield raw
    finally:
        raw.close()


@contextlib.contextmanager
def gzip_errors(path: Path):
    """Turns the exceptions of reading broken gzip data into one-line AnalyzeErrors."""
    try:
        yield
    except EOFError:
        raise AnalyzeError("truncated gzip: the compressed data ends before its end marker", path) from None
    except gzip.BadGzipFile as e:
        raise AnalyzeError(f"not a valid gzip file ({e})", path) from None
    except zlib.error as e:
        raise AnalyzeError(f"corrupt gzip data ({e})", path) from None


def read_lines(f, path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of ``f``; a line over ``MAX_LINE_BYTES`` is an error (read no further)."""
    number = 0
    limit = MAX_LINE_BYTES
    with gzip_errors(path):
        while True:
            line = f.readline(limit + 1)
            if not line:
                return
            number += 1
            if len(line) > limit:
                raise AnalyzeError(f"line longer than {_size(limit)} (the limit for one line or record)", path,
                                   f"line {number}")
            yield number, line


def read_document(f, path: Path) -> bytes:
    """All of ``f``, refused beyond ``MAX_DOCUMENT_BYTES`` (checked on the file size first when it is plain)."""
    limit = MAX_DOCUMENT_BYTES
    message = (f"a JSON document larger than {_size(limit)} (the limit for one JSON document); write it as "
               "JSON Lines (one record per line) instead")
    if path.suffix != ".gz" and os.fstat(f.fileno()).st_size > limit:
        raise AnalyzeError(message, path)
    with gzip_errors(path):
        data = f.read(limit + 1)
    if len(data) > limit:
        raise AnalyzeError(message, path)
    return data


class LineBoundedReader(io.RawIOBase):
    """A binary reader over ``f`` that fails once a line grows past ``MAX_LINE_BYTES``.

    Given to pyarrow's JSON and CSV readers (which would otherwise hold a whole huge line in memory);
    the caller then falls back to :func:`read_lines`, which reports the line number.
    """

    def __init__(self, f, path: Path):
        super().__init__()
        self._f, self._path, self._run, self._pos = f, path, 0, 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        with gzip_errors(self._path):
            n = self._f.readinto(buffer)
        if not n:
            return 0
        self._pos += n
        data = np.frombuffer(memoryview(buffer)[:n], dtype=np.uint8)
        newlines = np.flatnonzero(data == 10)
        if newlines.size == 0:
            longest = self._run = self._run + n
        else:
            inner = int(np.diff(newlines).max()) - 1 if newlines.size > 1 else 0
            longest = max(self._run + int(newlines[0]), inner)
            self._run = n - int(newlines[-1]) - 1
        if max(longest, self._run) > MAX_LINE_BYTES:
            raise AnalyzeError(f"a line longer than {_size(MAX_LINE_BYTES)} (the limit for one line or record)",
                               self._path)
        return n
