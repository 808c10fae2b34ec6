"""The YAML keys ``PackkitPlugin`` adds to axolotl's config schema (``get_input_args``)."""
from __future__ import annotations

from pydantic import BaseModel


class PackkitArgs(BaseModel):
    """``packkit_collator: true``: packkit's collator (``AxolotlPackingCollator``: cu_seq_lens built once per
    batch, each document's first label ignored) instead of axolotl's ``V2BatchSamplerDataCollatorForSeq2Seq``."""

    packkit_collator: bool | None = None
