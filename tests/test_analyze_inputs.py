"""``packkit analyze`` input side: every file format x every length source gives the exact lengths,
and the CLI runs end to end on each format."""
from __future__ import annotations

import json

import numpy as np
import pytest

from analyze_helpers import (expected, make_tokenizer, no_partial_outputs, records, run_cli, source_args, spec_for,
                             write, write_lengths_text)
from packkit.analyze import AnalyzeError, LengthSpec, analyze, read_lengths

pytestmark = pytest.mark.core

pytest.importorskip("pyarrow")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

FORMATS = ["jsonl", "jsonl.gz", "json", "parquet", "arrow", "arrow-stream", "hf"]
SOURCES = ["count", "ids", "text", "sum", "nested"]


@pytest.fixture(scope="module")
def recs():
    return records()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def files(tmp_path_factory, recs):
    if "hf" in FORMATS:
        pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("inputs")
    return {fmt: write(fmt, recs, root / fmt.replace(".", "_")) for fmt in FORMATS}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_lengths_of_every_format_and_source(files, recs, tokenizer, fmt, source):
    read = read_lengths(files[fmt], spec_for(source, tokenizer), progress=False)
    np.testing.assert_array_equal(read.lengths, expected(recs, source))
    assert read.info["format"] == {"jsonl.gz": "jsonl", "arrow-stream": "arrow"}.get(fmt, fmt)
    assert read.info["samples"] == len(recs)


def test_tokenizer_counts_match_transformers(recs, tokenizer):
    """The batched backend count equals len(tokenizer(text).input_ids), with and without special tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    for special in (True, False):
        want = [len(tok(r["text"], add_special_tokens=special)["input_ids"]) for r in recs]
        got = read_lengths(write("jsonl", recs, tokenizer.parent / f"tok_check_{special}"),
                           LengthSpec(text_fields=("text",), tokenizer=str(tokenizer), add_special_tokens=special),
                           progress=False).lengths
        np.testing.assert_array_equal(got, want)
    assert want != [len(tok(r["text"])["input_ids"]) for r in recs]  # the BOS really is counted above


def test_tokenizer_json_file_and_truncation_ignored(tmp_path, recs):
    """A bare tokenizer.json (tokenizers library) works, and a truncation setting in it never caps counts."""
    folder = make_tokenizer(tmp_path / "tok", truncation=3)
    data = write("jsonl", recs, tmp_path)
    for tok in (folder, folder / "tokenizer.json"):
        got = read_lengths(data, LengthSpec(text_fields=("text",), tokenizer=str(tok)), progress=False).lengths
        np.testing.assert_array_equal(got, expected(recs, "text"))
    assert expected(recs, "text").max() > 3


def test_chat_messages_use_the_chat_template(tmp_path, tokenizer):
    chats = [{"messages": [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "a b a"}]},
             {"messages": [{"role": "user", "content": "pack"}]}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    got = read_lengths(path, LengthSpec(text_fields=("messages",), tokenizer=str(tokenizer)), progress=False).lengths
    # "user hello world assistant a b a " -> 7 words; chat text gets no extra BOS
    np.testing.assert_array_equal(got, [7, 2])


def test_text_and_npy_files_of_lengths(tmp_path):
    lengths = np.random.default_rng(3).integers(0, 10_000, 500)
    text = write_lengths_text(lengths, tmp_path / "lengths.txt")
    np.testing.assert_array_equal(read_lengths(text).lengths, lengths)
    # comments, blank lines, CRLF and spaces go through the exact Python reader
    messy = tmp_path / "messy.txt"
    messy.write_bytes(b"# lengths\r\n 12 \r\n\r\n7\n+3\n")
    np.testing.assert_array_equal(read_lengths(messy).lengths, [12, 7, 3])
    np.save(tmp_path / "lengths.npy", lengths.astype(np.int32))
    np.testing.assert_array_equal(read_lengths(tmp_path / "lengths.npy").lengths, lengths)
    assert read_lengths(text, max_samples=10).lengths.tolist() == lengths[:10].tolist()
    assert read_lengths(text, LengthSpec(extra_tokens=1)).lengths.tolist() == (lengths + 1).tolist()


def test_guessed_fields_extra_tokens_and_max_samples(files, recs, tokenizer):
    read = read_lengths(files["parquet"], progress=False)  # no field given: num_tokens
    assert read.info["length_source"]["count_fields"] == ["num_tokens"]
    np.testing.assert_array_equal(read.lengths, expected(recs, "count"))
    read = read_lengths(files["jsonl"], LengthSpec(tokenizer=str(tokenizer)), progress=False)  # text with a tokenizer
    assert read.info["length_source"]["text_fields"] == ["text"]
    read = read_lengths(files["hf"], LengthSpec(ids_fields=("input_ids",), extra_tokens=2), max_samples=7,
                        progress=False)
    np.testing.assert_array_equal(read.lengths, expected(recs, "ids")[:7] + 2)


def test_jsonl_fast_path_and_python_reader_agree(tmp_path, recs):
    """pyarrow reads clean JSON Lines; anything unusual (integral floats, blank lines) goes through the
    Python reader: both give the same lengths."""
    clean = write("jsonl", recs, tmp_path / "clean")
    fast = read_lengths(clean, LengthSpec(count_fields=("num_tokens",)), progress=False)
    assert fast.info["reader"] == "pyarrow"
    odd = tmp_path / "odd.jsonl"
    odd.write_text("\n".join(json.dumps({**r, "num_tokens": float(r["num_tokens"])}) for r in recs) + "\n\n")
    slow = read_lengths(odd, LengthSpec(count_fields=("num_tokens",)), progress=False)
    assert slow.info["reader"] == "python"
    np.testing.assert_array_equal(fast.lengths, slow.lengths)
    gz = read_lengths(write("jsonl.gz", recs, tmp_path / "gz"), LengthSpec(count_fields=("num_tokens",)),
                      progress=False)
    assert gz.info["reader"] == "pyarrow"
    np.testing.assert_array_equal(gz.lengths, fast.lengths)


def test_json_layouts(tmp_path, recs):
    want = expected(recs, "count")
    spec = LengthSpec(count_fields=("num_tokens",))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": recs}))
    (tmp_path / "columns.json").write_text(json.dumps({k: [r[k] for r in recs] for k in recs[0]}))
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in recs))  # JSONL named .json
    for name in ("wrapped.json", "columns.json", "lines.json"):
        np.testing.assert_array_equal(read_lengths(tmp_path / name, spec, progress=False).lengths, want)


def test_dataset_dict_split(tmp_path, recs):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(recs[:30]),
                               "validation": datasets.Dataset.from_list(recs[30:])})
    dd.save_to_disk(str(tmp_path / "dd"))
    spec = LengthSpec(count_fields=("num_tokens",))
    assert read_lengths(tmp_path / "dd", spec).lengths.size == 30
    assert read_lengths(tmp_path / "dd", spec, split="validation").lengths.tolist() == [
        r["num_tokens"] for r in recs[30:]]
    with pytest.raises(AnalyzeError, match="no split 'test'; splits: train, validation"):
        read_lengths(tmp_path / "dd", spec, split="test")


@pytest.mark.parametrize("fmt,source", [("jsonl", "sum"), ("json", "count"), ("parquet", "ids"), ("arrow", "count"),
                                        ("arrow-stream", "sum"), ("hf", "text"), ("jsonl.gz", "nested")])
def test_cli_end_to_end(files, recs, tokenizer, tmp_path, capsys, fmt, source):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["analyze", files[fmt], "-o", out, *source_args(source, tokenizer),
                                    "--max-lengths", "2048,4096", "--no-figures", "--json"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    want = expected(recs, source)
    assert summary["stats"]["count"] == len(recs) and summary["stats"]["total_tokens"] == int(want.sum())
    assert summary["stats"]["max"] == int(want.max())
    stats = json.loads((out / "dataset_stats.json").read_text())
    assert stats["source"]["path"] == str(files[fmt])
    assert stats["mean"] == pytest.approx(want.mean())
    assert sorted(summary["files"]) == sorted(["dataset_stats.json", "packing_simulations.json",
                                               "recommendations.json", "report.md"])
    assert no_partial_outputs(tmp_path)


def test_cli_text_file_human_output(tmp_path, capsys):
    lengths = np.random.default_rng(0).integers(1, 5000, 2000)
    path = write_lengths_text(lengths, tmp_path / "lengths.txt")
    code, stdout, stderr = run_cli(["analyze", path, "-o", tmp_path / "out", "--no-figures"], capsys)
    assert code == 0, stderr
    assert f"{len(lengths):,} samples" in stdout and "recommended" in stdout and "report.md" in stdout


def test_analyze_api_reads_files(files, recs):
    result = analyze(files["parquet"], None, length_fields=["num_tokens", "image_tokens"], max_lengths=[4096],
                     progress=False)
    assert result.stats["total_tokens"] == int(expected(recs, "sum").sum())
    assert result.files == [] and result.out_dir is None and "# Packing analysis" in result.report
