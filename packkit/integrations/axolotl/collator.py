"""``AxolotlPackingCollator``: packkit's flat packing behind axolotl's collator interface (no axolotl import).

axolotl's ``V2BatchSamplerDataCollatorForSeq2Seq`` concatenates each bin's samples and gives per-document
``position_ids``; flash-attn's varlen path then rebuilds ``cu_seqlens`` from them on every layer call. This
collator packs the bins of one item into one ``[1, T]`` row with ``position_ids`` restarting per document and
``cu_seq_lens_q/k``, ``max_length_q/k`` built once (what transformers' flash-attention path reads instead), via
:class:`packkit.PackingCollator` with ``planned_rows=True``: the sampler's rows are kept as they are.

Differences from axolotl's collator, on purpose: every document's first label is ``label_pad_token_id`` (it would
otherwise be trained to predict the next document's first token from the previous one's last), and a sample's
``position_ids`` must be ``0..len-1`` (they are rebuilt; anything else is refused rather than overwritten).
"""
from __future__ import annotations

import numpy as np

from ...training.collator import PackingCollator


class AxolotlPackingCollator:
    """axolotl's collator signature (``tokenizer`` first, then the keyword arguments axolotl's builder passes).

    Args:
        tokenizer: supplies ``pad_token_id`` (0 if it has none).
        padding: ``True`` / ``"longest"`` (axolotl's default); other strategies are refused.
        pad_to_multiple_of: the flat row is padded to a multiple of it (one padding segment, labels ignored).
        return_tensors: ``"pt"`` only.
        label_pad_token_id: the ignored label (-100).
        max_length, position_pad_token_id, model: axolotl's DataCollatorForSeq2Seq fields; ``max_length`` must be
            None (rows are planned to capacity by the sampler), the other two change nothing here.
    """

    def __init__(self, tokenizer, padding=True, pad_to_multiple_of=None, return_tensors="pt", max_length=None,
                 label_pad_token_id=-100, position_pad_token_id=0, model=None):
        if padding not in (True, "longest"):
            raise ValueError(f"AxolotlPackingCollator packs to the longest row; padding={padding!r} is not supported")
        if return_tensors != "pt":
            raise ValueError(f"AxolotlPackingCollator returns torch tensors; return_tensors={return_tensors!r}")
        if max_length is not None:
            raise ValueError("AxolotlPackingCollator: max_length is not supported (the sampler plans rows to "
                             f"capacity), got {max_length!r}")
        pad = getattr(tokenizer, "pad_token_id", None)
        self.collator = PackingCollator(layout="flat", planned_rows=True, pad_token_id=0 if pad is None else int(pad),
                                        ignore_index=label_pad_token_id, pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, features):
        items = features if features and isinstance(features[0], list) else [features]
        rows = [[_sample(f, where=f"item {i} sample {j}") for j, f in enumerate(row)] for i, row in enumerate(items)]
        return self.collator(rows)


def _sample(feature: dict, where: str) -> dict:
    """The sample without ``length`` (a count) and without ``position_ids`` once checked to be ``0..len-1``."""
    out = {k: v for k, v in feature.items() if k not in ("length", "position_ids")}
    if "position_ids" in feature:
        positions = np.asarray(feature["position_ids"]).reshape(-1)
        if not np.array_equal(positions, np.arange(len(positions))):
            raise ValueError(f"{where}: position_ids must be 0..len-1 (this collator rebuilds them per document); "
                             "use axolotl's V2BatchSamplerDataCollatorForSeq2Seq for other positions")
    return out
