"""Hostile files given to ``packkit analyze``: special files, broken gzip, deep nesting, huge lines, files
changing while read. Each ends in exit 2 and one ``FILE[, line N]: problem`` line, never a hang or a
traceback; the cases already handled well (invalid UTF-8, folders, symlink loops, /dev/zero) stay so."""
from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import threading

import numpy as np
import pytest

from analyze_helpers import run_cli
from packkit.analyze import AnalyzeError, read_lengths, safe_input
from packkit.analyze import lengths as lengths_module
from packkit.analyze.lengths import LengthSpec

pytestmark = pytest.mark.core


@pytest.fixture
def deadline():
    """Fails the test instead of hanging forever (a FIFO that blocks the reader would)."""
    def expire(*_):
        raise TimeoutError("packkit analyze blocked")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _error(tmp_path, capsys, path, *args) -> str:
    code, stdout, stderr = run_cli(["analyze", path, "-o", tmp_path / "out", "--no-figures", *args], capsys)
    assert code == 2, (code, stderr)
    assert "Traceback" not in stderr and stdout == "" and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "out").exists()
    return stderr.strip().removeprefix("packkit analyze: error: ")


@pytest.mark.parametrize("fmt", ["auto", "jsonl", "text"])
def test_fifo_is_refused_at_once(tmp_path, capsys, deadline, fmt):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    message = _error(tmp_path, capsys, fifo, "--format", fmt)
    assert message == (f"{fifo}: a FIFO (named pipe), not a regular file: packkit analyze reads only regular "
                       "files and folders of saved datasets")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_character_devices_are_refused(tmp_path, capsys, deadline, device):
    if not os.path.exists(device):
        pytest.skip(f"{device} missing")
    assert _error(tmp_path, capsys, device, "--format", "text").startswith(f"{device}: a character device, not a "
                                                                           "regular file")


def test_socket_is_refused(tmp_path, capsys, deadline):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert _error(tmp_path, capsys, path).startswith(f"{path}: a socket, not a regular file")


def test_fifo_swapped_in_after_the_check_does_not_block(tmp_path, deadline):
    """The check and the open race; the open itself never blocks (O_NONBLOCK) and re-checks the kind."""
    fifo = tmp_path / "late.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(AnalyzeError, match="a FIFO"):
        with safe_input.open_input(fifo):
            pass


GZ = gzip.compress(b"".join(b'{"n": %d}\n' % (i % 9 + 1) for i in range(2000)), mtime=0)  # mtime=0: the same test ids in every pytest-xdist worker


@pytest.mark.parametrize("name,content,args", [
    ("t.jsonl.gz", GZ[: len(GZ) // 2], ["--length-field", "n"]),
    ("t.jsonl.gz", GZ[:-4], ["--length-field", "n"]),  # only the trailer missing
    ("t.txt.gz", gzip.compress(b"3\n" * 5000, mtime=0)[:40], []),
    ("t.json.gz", gzip.compress(json.dumps([{"n": 3}] * 500).encode(), mtime=0)[:30], ["--length-field", "n"]),
])
def test_truncated_gzip(tmp_path, capsys, name, content, args):
    path = tmp_path / name
    path.write_bytes(content)
    assert _error(tmp_path, capsys, path, *args) == f"{path}: truncated gzip: the compressed data ends before its end marker"


def test_not_gzip_and_corrupt_gzip(tmp_path, capsys):
    path = tmp_path / "fake.jsonl.gz"
    path.write_bytes(b'{"n": 3}\n')
    assert _error(tmp_path, capsys, path, "--length-field", "n").startswith(f"{path}: not a valid gzip file")
    corrupt = bytearray(GZ)
    corrupt[-8] ^= 0xFF  # the CRC-32 in the trailer
    path.write_bytes(bytes(corrupt))
    assert _error(tmp_path, capsys, path, "--length-field", "n").startswith(
        f"{path}: not a valid gzip file (CRC check failed")


@pytest.mark.parametrize("name,content,where", [
    ("deep.jsonl", b'{"n": 3}\n{"n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ", line 2"),
    ("deep.json", b'[{"n": 3}, {"n": 4, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]", ""),
    ("deep2.json", b"[" * 1_000_000, ""),
])
def test_deep_nesting_is_an_error(tmp_path, capsys, name, content, where):
    path = tmp_path / name
    path.write_bytes(content)
    message = _error(tmp_path, capsys, path, "--length-field", "n")
    assert message.startswith(f"{path}{where}: JSON nested too deeply (more than about "), message


def test_deep_nesting_in_an_unused_field_with_the_fast_reader(tmp_path):
    """pyarrow's reader skips unused fields without recursing: a correct result, not a crash."""
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"n": 3}\n{"n": 4, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    assert read_lengths(path, LengthSpec(count_fields=("n",))).lengths.tolist() == [3, 4]


@pytest.mark.parametrize("name,line,args", [
    ("long.jsonl", b'{"n": 4, "x": "' + b"a" * 6_000_000 + b'"}\n', ["--length-field", "n"]),  # > pyarrow's block
    ("long2.jsonl", b'{"n": 4, "x": "' + b"a" * 5_000 + b'"}\n', ["--length-field", "n"]),  # pyarrow's block
    ("long.txt", b"4" * 5_000 + b"\n", []),
    ("long.jsonl.gz", b'{"n": 4, "x": "' + b"a" * 5_000 + b'"}\n', ["--length-field", "n"]),
])
def test_line_over_the_limit(tmp_path, capsys, monkeypatch, name, line, args):
    monkeypatch.setattr(safe_input, "MAX_LINE_BYTES", 4096)
    path = tmp_path / name
    content = b'{"n": 3}\n' + line if name.endswith((".jsonl", ".jsonl.gz")) else b"3\n" + line
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    assert _error(tmp_path, capsys, path, *args) == (f"{path}, line 2: line longer than 4096 bytes (the limit for one "
                                                     "line or record)")


def test_line_limit_control(tmp_path, monkeypatch):
    """Control: the same lines pass under the real limit (128 MiB), so the test above can fail."""
    assert safe_input.MAX_LINE_BYTES == 128 << 20
    path = tmp_path / "ok.jsonl"
    path.write_bytes(b'{"n": 3}\n{"n": 4, "x": "' + b"a" * 6_000_000 + b'"}\n')
    assert read_lengths(path, LengthSpec(count_fields=("n",))).lengths.tolist() == [3, 4]


def test_json_document_over_the_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(safe_input, "MAX_DOCUMENT_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps([{"n": i + 1} for i in range(200)]))
    assert _error(tmp_path, capsys, path, "--length-field", "n").startswith(
        f"{path}: a JSON document larger than 1000 bytes (the limit for one JSON document); write it as JSON Lines")
    gz = tmp_path / "big.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert "a JSON document larger than 1000 bytes" in _error(tmp_path, capsys, gz, "--length-field", "n")


@pytest.mark.parametrize("name,content,fmt_args", [
    ("grow.txt", b"3\n4\n5\n", []),
    ("grow.jsonl", b'{"n": 3}\n{"n": 4}\n', ["--length-field", "n"]),
    ("grow.parquet", None, ["--length-field", "n"]),
])
def test_file_changed_while_read(tmp_path, capsys, monkeypatch, name, content, fmt_args):
    path = tmp_path / name
    if content is None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"n": [3, 4, 5]}), path)
    else:
        path.write_bytes(content)
    real = lengths_module.Snapshot.check

    def append_then_check(self, p):  # another process appends while we read
        with open(p, "ab") as f:
            f.write(b"6\n")
        return real(self, p)

    monkeypatch.setattr(lengths_module.Snapshot, "check", append_then_check)
    message = _error(tmp_path, capsys, path, *fmt_args)
    assert message.startswith(f"{path}: the file changed while being read (size "), message


def test_file_replaced_while_read(tmp_path, monkeypatch):
    path = tmp_path / "swap.txt"
    path.write_text("3\n4\n")
    real = lengths_module.Snapshot.check

    def replace_then_check(self, p):
        other = tmp_path / "other.txt"
        other.write_text("3\n4\n")
        os.replace(other, p)
        return real(self, p)

    monkeypatch.setattr(lengths_module.Snapshot, "check", replace_then_check)
    with pytest.raises(AnalyzeError, match="the file changed while being read \\(was replaced\\)"):
        read_lengths(path)


def test_file_truncated_during_a_real_read(tmp_path, deadline):
    """No monkeypatching: a thread truncates the file while the Python reader is in it."""
    path = tmp_path / "t.txt"
    path.write_bytes(b"".join(b"%d\n" % (i % 50 + 1) for i in range(200_000)))
    started = threading.Event()
    real_read_lines = safe_input.read_lines

    def slow_lines(f, p):
        for item in real_read_lines(f, p):
            if item[0] == 10:
                started.set()
                thread.join()
            yield item

    def truncate():
        started.wait(10)
        with open(path, "r+b") as f:
            f.truncate(1000)

    thread = threading.Thread(target=truncate)
    thread.start()
    import packkit.analyze.readers as readers

    mp = pytest.MonkeyPatch()
    mp.setattr(readers, "read_lines", slow_lines)
    mp.setattr(readers, "_read_text_lengths_arrow", lambda *a: None)
    try:
        with pytest.raises(AnalyzeError, match="changed while being read"):
            read_lengths(path)
    finally:
        mp.undo()


# --- cases that were already handled well: keep them so -------------------------------------------


def test_invalid_utf8_folder_and_symlink_loop(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"n": 3}\n{"n": "\xff\xfe"}\n')
    assert _error(tmp_path, capsys, bad, "--length-field", "n").startswith(f"{bad}, line 2: not valid UTF-8")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "a folder must be a dataset saved with datasets' save_to_disk" in _error(tmp_path, capsys, folder)
    loop = tmp_path / "loop.jsonl"
    os.symlink(loop, loop)
    assert _error(tmp_path, capsys, loop) == f"{loop}: cannot read: too many levels of symbolic links"


def test_huge_and_negative_numbers(tmp_path, capsys):
    path = tmp_path / "huge.txt"
    path.write_text("3\n" + str(2**64) + "\n")
    assert _error(tmp_path, capsys, path) == f"{path}, line 2: length {2**64} does not fit in int64"
    path = tmp_path / "huge.jsonl"
    path.write_text('{"n": 3}\n{"n": %d}\n' % 2**70)
    assert _error(tmp_path, capsys, path, "--length-field", "n") == (
        f"{path}, line 2: length {2**70} in field 'n' does not fit in int64")
    npy = tmp_path / "neg.npy"
    np.save(npy, np.array([3, -1]))
    assert _error(tmp_path, capsys, npy) == f"{npy}, row 1: negative length -1"
    truncated = tmp_path / "cut.npy"
    truncated.write_bytes(npy.read_bytes()[:-4])
    assert _error(tmp_path, capsys, truncated).startswith(f"{truncated}: not a readable .npy array")
