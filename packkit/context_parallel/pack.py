"""``packkit.pack_context_parallel``: one CP rank's batch, for a static CP size (``fused.py``: the shard of the row
``pack_sequences`` would build) or for one pass of a dynamic CP plan (``pass_batch.py``), chosen by what is given:
``pack_context_parallel(sequences, cp_size, cp_rank, mode, ...)`` or ``pack_context_parallel(sequences, cp_plan,
pass_index, rank, ...)`` (also ``plan=cp_plan, pass_index=, rank=`` by keyword)."""
from __future__ import annotations

from typing import Optional

from ..planning.context_parallel import ContextParallelPlan
from .fused import pack_context_parallel as pack_static
from .pass_batch import pack_context_parallel_pass

# The static form's options a pass does not take (its plan fixes the layout); a pass refuses them when set.
_STATIC_ONLY = {"lengths": None, "capacity": None, "algorithm": "obfd", "overlong": "error", "layout": "flat",
                "num_rows": None, "row_len": None, "position_ids_start": 0, "fields": None, "pad_values": None,
                "extra_fields": "error", "max_sequences": None, "max_length_buckets": None}


def pack_context_parallel(sequences, cp_size=None, cp_rank=None, mode="zigzag", *, lengths=None, labels=None,
                          plan=None, capacity: Optional[int] = None, algorithm: str = "obfd",
                          overlong: str = "error", layout: str = "flat", num_rows: Optional[int] = None,
                          row_len: Optional[int] = None, pad_token_id: int = 0, ignore_index: int = -100,
                          mask_first_label: bool = True, separator_id: Optional[int] = None,
                          position_ids_start: int = 0, device=None, backend: str = "auto",
                          fields: Optional[dict] = None, pad_values: Optional[dict] = None,
                          extra_fields: str = "error", return_info: bool = False, pass_index=None, rank=None,
                          max_sequences: Optional[int] = None, max_length_buckets=None):
    """One context-parallel rank's batch.

    * Static CP, ``pack_context_parallel(sequences, cp_size, cp_rank, mode="zigzag", ...)``: rank ``cp_rank`` of
      ``cp_size``'s shard of the batch ``pack_sequences`` would build, in one launch (every option:
      :func:`packkit.context_parallel.fused.pack_context_parallel`; ``max_sequences=N``: N slots per shard,
      ``cu_seq_lens_q/k`` ``N + 1`` long; ``max_length_buckets``: bucketed ``max_length_q/k``).  A dynamic CP pass
      refuses both by name.
    * Dynamic CP, ``pack_context_parallel(sequences, cp_plan, pass_index, rank)`` or
      ``pack_context_parallel(sequences, plan=cp_plan, pass_index=..., rank=...)`` with a
      :class:`packkit.ContextParallelPlan`: global rank ``rank``'s batch for that pass, its ``cp_size`` the pass's
      group's, its ``cp_rank`` its index in the group (:func:`packkit.pack_context_parallel_pass`; ``labels``,
      ``pad_token_id``, ``ignore_index``, ``mask_first_label``, ``separator_id``, ``device``, ``backend``,
      ``return_info`` as there).
    """
    common = dict(labels=labels, pad_token_id=pad_token_id, ignore_index=ignore_index,
                  mask_first_label=mask_first_label, separator_id=separator_id, device=device, backend=backend,
                  return_info=return_info)
    if isinstance(cp_size, ContextParallelPlan) or isinstance(plan, ContextParallelPlan):
        if isinstance(cp_size, ContextParallelPlan):
            if plan is not None or pass_index is not None or (rank is not None and mode != "zigzag"):
                raise ValueError("give the pass as (sequences, cp_plan, pass_index, rank) or as plan=, pass_index=, "
                                 "rank= keywords, not both")
            plan, pass_index, rank = cp_size, cp_rank, rank if rank is not None else mode
        elif cp_size is not None or cp_rank is not None:
            raise ValueError("with plan= a ContextParallelPlan, give pass_index= and rank=, not cp_size / cp_rank "
                             "(the pass's group sets them)")
        if pass_index is None or rank is None or rank == "zigzag":
            raise TypeError("a dynamic CP pass needs pass_index and rank: pack_context_parallel(sequences, cp_plan, "
                            "pass_index, rank)")
        given = dict(lengths=lengths, capacity=capacity, algorithm=algorithm, overlong=overlong, layout=layout,
                     num_rows=num_rows, row_len=row_len, position_ids_start=position_ids_start, fields=fields,
                     pad_values=pad_values, extra_fields=extra_fields, max_sequences=max_sequences,
                     max_length_buckets=max_length_buckets)
        for name, value in given.items():
            default = _STATIC_ONLY[name]
            if (value is not None) if default is None else (not isinstance(value, type(default)) or value != default):
                raise ValueError(f"{name}= is an option of static CP packing; a dynamic CP pass is laid out by its "
                                 f"plan (pack_context_parallel_pass takes labels, pad_token_id, ignore_index, "
                                 f"mask_first_label, separator_id, device, backend, return_info)")
        return pack_context_parallel_pass(sequences, plan, pass_index, rank, **common)
    if pass_index is not None or rank is not None:
        raise ValueError("pass_index= and rank= select a pass of a dynamic CP plan: give plan= a "
                         "packkit.ContextParallelPlan (packkit.plan_context_parallel), or use cp_size / cp_rank")
    if cp_size is None or cp_rank is None:
        raise TypeError("pack_context_parallel needs cp_size and cp_rank (static CP) or a ContextParallelPlan, "
                        "pass_index and rank (dynamic CP)")
    return pack_static(sequences, cp_size, cp_rank, mode, lengths=lengths, plan=plan, capacity=capacity,
                       algorithm=algorithm, overlong=overlong, layout=layout, num_rows=num_rows, row_len=row_len,
                       position_ids_start=position_ids_start, fields=fields, pad_values=pad_values,
                       extra_fields=extra_fields, max_sequences=max_sequences,
                       max_length_buckets=max_length_buckets, **common)
