"""Bad input to ``packkit analyze``: exit code 2, one ``packkit analyze: error: FILE, line/row N: problem``
line on stderr (no traceback), and no output that looks complete."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from analyze_helpers import make_tokenizer, no_partial_outputs, records, run_cli, write, write_lengths_text
from packkit.analyze import AnalyzeError, MissingDependency, analyze_lengths

pytestmark = pytest.mark.core

pytest.importorskip("pyarrow")


def _parquet(path, columns: dict):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


# (file name, content: str/bytes or a callable(path), extra CLI args, expected message after "error: ")
BAD_FILES = [
    ("bad.jsonl", '{"n": 3}\n{"n": 4}\n{"n": 5,,}\n', ["--length-field", "n"],
     "bad.jsonl, line 3: malformed JSON: Expecting property name enclosed in double quotes (column 9)"),
    ("missing.jsonl", '{"n": 3}\n{"n": 4}\n\n{"m": 5}\n', ["--length-field", "n"],
     "missing.jsonl, line 4: missing field 'n' (fields present: m)"),
    ("neg.jsonl", '{"n": 3}\n{"n": -4}\n', ["--length-field", "n"], "neg.jsonl, line 2: negative length -4 in field 'n'"),
    ("float.jsonl", '{"n": 3}\n{"n": 4.5}\n', ["--length-field", "n"],
     "float.jsonl, line 2: non-integer length 4.5 in field 'n'"),
    ("null.jsonl", '{"n": 3}\n{"n": null}\n', ["--length-field", "n"],
     "null.jsonl, line 2: field 'n' is null, not a token count"),
    ("str.jsonl", '{"n": 3}\n{"n": "4"}\n', ["--length-field", "n"],
     "str.jsonl, line 2: field 'n' holds str '4', not an integer token count; to tokenize text use --text-field"),
    ("ids.jsonl", '{"ids": [1, 2]}\n{"ids": 7}\n', ["--ids-field", "ids"],
     "ids.jsonl, line 2: field 'ids' holds int, not a list of token ids"),
    ("array.jsonl", '{"n": 3}\n[1, 2]\n', ["--length-field", "n"], "array.jsonl, line 2: expected a JSON object, got an array"),
    ("empty.jsonl", "", [], "empty.jsonl: no samples (the file holds no records)"),
    ("rows.json", '[{"n": 3}, {"m": 4}]', ["--length-field", "n"], "rows.json, row 1: missing field 'n' (fields present: m)"),
    ("broken.json", '[{"n": 3},\n {"m": 4}', ["--length-field", "n"], "broken.json, line 2: malformed JSON"),
    ("neg.txt", "3\n4\n-5\n", [], "neg.txt, line 3: negative length -5"),
    ("float.txt", "3\n4.5\n", [], "float.txt, line 2: non-integer length '4.5'"),
    ("word.txt", "3\n\nabc\n", [], "word.txt, line 3: expected one integer length per line, got 'abc'"),
    ("empty.txt", "", [], "empty.txt: no samples (the dataset is empty)"),
    ("zeros.txt", "0\n0\n", [], "zeros.txt: all 2 samples have length 0"),
    ("junk.xyz", b"\x00\x01\x02junk", [], "junk.xyz: unknown format (extension '.xyz'"),
    ("null.parquet", lambda p: _parquet(p, {"n": [1, None, 3]}), ["--length-field", "n"],
     "null.parquet, row 1: field 'n' is null"),
    ("neg.parquet", lambda p: _parquet(p, {"n": [1, 2, -3]}), ["--length-field", "n"],
     "neg.parquet, row 2: negative length -3 in field 'n'"),
    ("float.parquet", lambda p: _parquet(p, {"n": [1.0, 2.5, 3.0]}), ["--length-field", "n"],
     "float.parquet, row 1: non-integer length 2.5 in field 'n'"),
    ("nofield.parquet", lambda p: _parquet(p, {"n": [1, 2]}), ["--length-field", "tokens"],
     "nofield.parquet: no field 'tokens' (fields: n)"),
    ("text.parquet", lambda p: _parquet(p, {"t": ["a", "b"]}), ["--length-field", "t"],
     "text.parquet: field 't' has type string, not an integer token count; to tokenize text use --text-field"),
    ("guess.parquet", lambda p: _parquet(p, {"t": ["a", "b"]}), [], "guess.parquet: cannot tell which field holds the length"),
    ("not.parquet", "hello", [], "not.parquet: not a readable Parquet file"),
    ("not.arrow", "hello", [], "not.arrow: not an Arrow IPC file or stream"),
    ("lengths.txt", "3\n", ["--length-field", "n"], "lengths.txt: a text file of lengths has no fields"),
]


@pytest.mark.parametrize("name,content,args,message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_file(tmp_path, capsys, name, content, args, message):
    path = tmp_path / name
    if callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["analyze", path, "-o", out, *args], capsys)
    assert code == 2
    assert stderr.startswith(f"packkit analyze: error: {tmp_path}/{message}"), stderr
    assert "Traceback" not in stderr and stdout == ""
    assert not out.exists() and no_partial_outputs(tmp_path)


BAD_OPTIONS = [
    (["--target-efficiency", "1.5"], "--target-efficiency must be in (0, 1]"),
    (["--max-dropped-fraction", "-0.1"], "--max-dropped-fraction must be in [0, 1]"),
    (["--max-lengths", "4096,abc"], "max lengths: 'abc' is not a positive integer or 'auto'"),
    (["--max-lengths", "0"], "max lengths: 0 is not a positive integer"),
    (["--algorithms", "first_fit"], "unknown algorithm 'first_fit'; allowed: nf, ffd, bfd, obfd, ogbfd (or 'all')"),
    (["--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
    (["--dp-size", "-2"], "--dp-size must be a positive integer, got -2"),
    (["--max-samples", "0"], "--max-samples must be a positive integer, got 0"),
    (["--split", "train"], "lengths.txt: --split applies only to saved dataset folders"),
    (["--format", "hf"], "lengths.txt: format 'hf' needs a folder"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options(tmp_path, capsys, args, message):
    path = write_lengths_text([5, 6, 7], tmp_path / "lengths.txt")
    out = tmp_path / "out"
    code, _, stderr = run_cli(["analyze", path, "-o", out, *args], capsys)
    assert code == 2 and message in stderr and "Traceback" not in stderr, stderr
    assert not out.exists() and no_partial_outputs(tmp_path)


def test_missing_file_and_tokenizer(tmp_path, capsys):
    code, _, stderr = run_cli(["analyze", tmp_path / "nope.jsonl", "-o", tmp_path / "out"], capsys)
    assert code == 2 and stderr.strip() == f"packkit analyze: error: {tmp_path / 'nope.jsonl'}: no such file or directory"
    data = write("jsonl", records(3), tmp_path)
    code, _, stderr = run_cli(["analyze", data, "-o", tmp_path / "out", "--text-field", "text"], capsys)
    assert code == 2 and "need --tokenizer DIR" in stderr
    code, _, stderr = run_cli(["analyze", data, "-o", tmp_path / "out", "--text-field", "text", "--tokenizer",
                               tmp_path / "no-tok"], capsys)
    assert code == 2 and f"{tmp_path / 'no-tok'}: tokenizer not found" in stderr
    assert not (tmp_path / "out").exists()


def test_text_field_errors_name_the_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    tok = make_tokenizer(tmp_path / "tok")
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "hello"}\n{"text": 5}\n')
    code, _, stderr = run_cli(["analyze", path, "-o", tmp_path / "out", "--text-field", "text", "--tokenizer", tok],
                              capsys)
    assert code == 2 and f"{path}, line 2: field 'text' must be text (or a list of chat messages) to tokenize" in stderr


def test_failed_run_leaves_previous_outputs_alone(tmp_path, capsys):
    good = write_lengths_text(np.arange(1, 200), tmp_path / "good.txt")
    out = tmp_path / "out"
    code, _, stderr = run_cli(["analyze", good, "-o", out, "--no-figures"], capsys)
    assert code == 0, stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nx\n")
    code, _, stderr = run_cli(["analyze", bad, "-o", out, "--no-figures"], capsys)
    assert code == 2 and "bad.txt, line 3" in stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert no_partial_outputs(tmp_path)


def test_output_path_is_a_file(tmp_path, capsys):
    good = write_lengths_text([3, 4], tmp_path / "good.txt")
    (tmp_path / "out").write_text("not a folder")
    code, _, stderr = run_cli(["analyze", good, "-o", tmp_path / "out"], capsys)
    assert code == 2 and f"{tmp_path / 'out'}: the output path exists and is not a folder" in stderr


def test_missing_matplotlib_names_the_package(tmp_path, monkeypatch):
    """A figure step that cannot run fails before anything is written, naming the pip package."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependency, match=r"figures \(or pass --no-figures\) needs the 'matplotlib' package.*"
                                                r"pip install matplotlib"):
        analyze_lengths([100, 200, 300], tmp_path / "out", max_lengths=[512])
    assert not (tmp_path / "out").exists() and no_partial_outputs(tmp_path)
    analyze_lengths([100, 200, 300], tmp_path / "out", max_lengths=[512], figures=False)  # fine without figures
    assert (tmp_path / "out" / "report.md").exists() and not (tmp_path / "out" / "figures").exists()


def test_api_errors_are_value_errors():
    with pytest.raises(ValueError, match="negative length -1 at index 1"):
        analyze_lengths([3, -1])
    with pytest.raises(AnalyzeError, match="no samples"):
        analyze_lengths([])
    with pytest.raises(AnalyzeError, match="lengths: lengths must be integers"):
        analyze_lengths([1.5, 2.0])
    with pytest.raises(AnalyzeError, match="overlong must be one of drop, truncate, split, got 'error'"):
        analyze_lengths([3, 4], overlong="error")


def test_console_script_exit_code_and_no_traceback(tmp_path):
    """The real entry point in a fresh process: exit status 2 and a one-line error."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"num_tokens": 3}\n{"num_tokens": -3}\n')
    proc = subprocess.run([sys.executable, "-m", "packkit", "analyze", str(bad), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"packkit analyze: error: {bad}, line 2: negative length -3 in field 'num_tokens'"]
    assert not (tmp_path / "out").exists()
    ok = write_lengths_text([10, 20, 30], tmp_path / "ok.txt")
    proc = subprocess.run([sys.executable, "-m", "packkit", "analyze", str(ok), "-o", str(tmp_path / "out"),
                           "--json", "--no-figures"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["total_tokens"] == 60
