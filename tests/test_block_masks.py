"""packkit's FlexAttention masks per layer type equal transformers' own mask functions on every document.

Each document of a packed row, evaluated densely, must be exactly what transformers builds for that document
run alone (``causal_mask_function``, ``sliding_window_causal_mask_function``, ``chunked_causal_mask_function``:
the window off-by-one included), and nothing across documents. Model-level exactness (flex attention through
real models) is in tests/test_model_zoo.py.
"""
from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings, strategies as st

import packkit
from packkit.training.block_masks import LayerBlockMasks, document_causal_block_mask, layer_block_masks

pytestmark = pytest.mark.core

masking_utils = pytest.importorskip("transformers.masking_utils")


def dense(block_mask, row: int, length: int) -> torch.Tensor:
    q, kv = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return block_mask.mask_mod(torch.tensor(row), torch.tensor(0), q.expand(length, length), kv.expand(length, length))


def transformers_mask(mask_function, length: int) -> torch.Tensor:
    q, kv = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return mask_function(torch.tensor(0), torch.tensor(0), q.expand(length, length), kv.expand(length, length))


def seq_idx_of(rows):
    """[B, T] segment ids from per-row lists of document lengths (ids unique per batch, as packkit's)."""
    out, k = [], 0
    length = max(sum(r) for r in rows)
    for r in rows:
        ids = []
        for n in r:
            ids += [k] * n
            k += 1
        ids += [k] * (length - len(ids))  # the row's padding tail, one more segment
        k += 1
        out.append(ids)
    return torch.tensor(out)


def expected(rows, mask_function):
    seq = seq_idx_of(rows)
    length = seq.shape[1]
    want = torch.zeros(len(rows), length, length, dtype=torch.bool)
    for b, r in enumerate(rows):
        start = 0
        for n in list(r) + [length - sum(r)]:
            want[b, start:start + n, start:start + n] = transformers_mask(mask_function, n)
            start += n
    return seq, want


CONFIGS = {
    "full_attention": (types.SimpleNamespace(layer_types=["full_attention"]), masking_utils.causal_mask_function),
    "sliding_attention": (types.SimpleNamespace(layer_types=["sliding_attention"], sliding_window=3),
                          masking_utils.sliding_window_causal_mask_function(3)),
    "chunked_attention": (types.SimpleNamespace(layer_types=["chunked_attention"], attention_chunk_size=3),
                          masking_utils.chunked_causal_mask_function(3, torch.zeros(1, dtype=torch.int64))),
}


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=3),
       kind=st.sampled_from(sorted(CONFIGS)))
def test_each_document_gets_transformers_mask(rows, kind):
    config, function = CONFIGS[kind]
    seq, want = expected(rows, function)
    mask = layer_block_masks(seq, config, block_size=8)
    for b in range(len(rows)):
        assert torch.equal(dense(mask, b, seq.shape[1]), want[b]), (kind, rows, b)


def test_several_layer_types_give_a_mapping_mistral_style_one_mask():
    seq = seq_idx_of([[7, 5]])
    gemma = types.SimpleNamespace(layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                  sliding_window=4)
    masks = layer_block_masks(seq, gemma)
    assert isinstance(masks, LayerBlockMasks) and sorted(masks) == ["full_attention", "sliding_attention"]
    assert not torch.equal(dense(masks["full_attention"], 0, 12), dense(masks["sliding_attention"], 0, 12))
    with pytest.raises(ValueError, match="'chunked_attention'"):
        masks["chunked_attention"]
    with pytest.raises(ValueError, match="mapping per layer type"):
        masks.ndim
    mistral = types.SimpleNamespace(sliding_window=4)  # no layer_types: every layer takes the window
    _, want = expected([[7, 5]], masking_utils.sliding_window_causal_mask_function(4))
    assert torch.equal(dense(layer_block_masks(seq, mistral), 0, 12), want[0])


@pytest.mark.parametrize("config, match", [
    (types.SimpleNamespace(layer_types=["linear_attention", "full_attention"]), "'linear_attention'"),
    (types.SimpleNamespace(layer_types=["sliding_attention"], sliding_window=None), "sliding_window=None"),
    (types.SimpleNamespace(layer_types=["chunked_attention"], attention_chunk_size=0), "attention_chunk_size=0"),
    (types.SimpleNamespace(is_causal=False), "bidirectional"),
])
def test_layer_types_without_a_mask_are_refused(config, match):
    with pytest.raises(ValueError, match=match):
        layer_block_masks(seq_idx_of([[4]]), config)


def _builder_reads_shape(builder_name: str, config, mask):
    """What transformers' mask builders do with a 4D mask: read its shape (and return it as is)."""
    namespace = {"__name__": "transformers.masking_utils"}
    exec(f"def {builder_name}(config, mask):\n    return len(mask.shape)", namespace)
    return namespace[builder_name](config, mask)


def test_document_causal_mask_refuses_a_window_shorter_than_a_document():
    mask = document_causal_block_mask(seq_idx_of([[7, 5]]))
    assert mask.packkit_max_document == 7
    window = types.SimpleNamespace(model_type="mistral", sliding_window=6)
    with pytest.raises(ValueError, match=r"sliding_window=6\) and a document of 7 tokens"):
        _builder_reads_shape("create_sliding_window_causal_mask", window, mask)
    chunked = types.SimpleNamespace(model_type="llama4_text", attention_chunk_size=3, layer_types=["chunked_attention"])
    with pytest.raises(ValueError, match="attention_chunk_size=3"):
        _builder_reads_shape("create_chunked_causal_mask", chunked, mask)
    # Where the window cuts nothing, or no layer uses it, the document-causal mask is exact and allowed.
    assert _builder_reads_shape("create_sliding_window_causal_mask", types.SimpleNamespace(sliding_window=7), mask) == 4
    unused = types.SimpleNamespace(sliding_window=2, layer_types=["full_attention"])
    assert _builder_reads_shape("create_sliding_window_causal_mask", unused, mask) == 4
    assert _builder_reads_shape("create_causal_mask", window, mask) == 4


def test_collator_masks_per_layer_type():
    transformers = pytest.importorskip("transformers")
    feats = [{"input_ids": list(range(1, 12))}, {"input_ids": [3, 4, 5]}]
    config = transformers.Gemma2Config(num_hidden_layers=2, sliding_window=4)
    batch = packkit.PackingCollator(return_block_mask=True, model_config=config)(feats)
    assert sorted(batch["attention_mask"]) == ["full_attention", "sliding_attention"]
    _, want = expected([[11, 3]], masking_utils.sliding_window_causal_mask_function(4))
    assert torch.equal(dense(batch["attention_mask"]["sliding_attention"], 0, 14), want[0])
    plain = packkit.PackingCollator(return_block_mask=True)(feats)["attention_mask"]
    assert plain.packkit_max_document == 11
    # model_config without return_block_mask: checks the layouts the model takes (issue 50), adds no mask
    assert "attention_mask" not in packkit.PackingCollator(model_config=config)(feats)
