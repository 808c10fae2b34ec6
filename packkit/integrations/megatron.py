"""Megatron-Core 0.16 drop-in: a packkit batch as Megatron's THD input (``tokens``, ``labels``, ``loss_mask``,
``position_ids`` and a ``PackedSeqParams``), with every document padded to Megatron's context-parallel rule.

Megatron reads packed batches as THD: documents back to back, ``cu_seqlens_q/kv`` their real lengths and
``cu_seqlens_q/kv_padded`` where each one starts once padded; with context parallelism (cp > 1) every document
must be a multiple of ``2 * cp`` (Transformer Engine cuts it in ``2 * cp`` chunks; rank r takes chunks r and
``2*cp-1-r``), and with sequence parallelism also of ``tp * cp``. :func:`megatron_pad_multiple` is that rule; give
it to ``packkit.plan(..., pad_to_multiple_of=)`` so planned rows still fit once padded.

* :func:`packed_seq_params`: ``(batch, PackedSeqParams)`` from a flat packkit batch (``pack_sequences``).
* :func:`thd_batch_on_cp_rank`: a rank's zigzag shard of that batch, TE's ``thd_get_partitioned_indices``
  without TE (Megatron's ``get_thd_batch_on_this_cp_rank`` needs TE for cp > 1).
* :class:`PackkitCPScheduler`, :func:`install_cp_scheduler` / :func:`uninstall_cp_scheduler`: dynamic CP in
  Megatron's hybrid-CP data path (``megatron_cp.py``).
* :func:`pipeline_data_iterator`: one packed micro-batch per ``next()``, each with its own ``PackedSeqParams``,
  for Megatron's pipeline schedules with ``variable_seq_lengths=True`` (docs/pipeline.md: where users run it).

Megatron-Core stays optional: it is imported only when these functions run (``pip install packkit[megatron]``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..context_parallel.shard import _flat_tokens, _host_cu, _src_index_host
from ..packing.checks import check_bool, check_fill, check_int, check_padding, refuse_meta_batch
from ..packing.tensors import host_tensor, to_device
from .megatron_cp import PackkitCPScheduler  # noqa: F401  (re-exported: dynamic CP, hybrid-CP data path)
from .megatron_cp import install as install_cp_scheduler  # noqa: F401
from .megatron_cp import uninstall as uninstall_cp_scheduler  # noqa: F401

# Parallel sizes (cp, tp) up to 2**16: packed_seq_params pads every document to a multiple of 2 * cp_size, so the
# output is sized by cp_size (2**18 took ~228 MB for a few tokens; 2**16, 21 MB); no CP group is wider.
MAX_PARALLEL = 1 << 16
MEGATRON_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def _packed_seq_params_cls():
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without Megatron-Core
        raise ModuleNotFoundError("packkit.integrations.megatron needs Megatron-Core (pip install 'packkit[megatron]')",
                                  name=exc.name) from exc
    return PackedSeqParams


def megatron_pad_multiple(cp_size: int = 1, tp_size: int = 1, sequence_parallel: bool = False) -> int:
    """What each document's length must be a multiple of: ``2 * cp`` with context parallelism (1 without: TE's
    THD attention needs no padding at cp = 1, and Megatron's ``roll_tensor`` indexes with the unpadded
    ``cu_seqlens_q``), and with sequence parallelism the lcm of that and ``tp * cp`` (the sequence is then split
    over tp ranks too)."""
    cp_size, tp_size = check_int(cp_size, "cp_size", 1), check_int(tp_size, "tp_size", 1)
    for name, value in (("cp_size", cp_size), ("tp_size", tp_size)):
        if value > MAX_PARALLEL:  # the planner's dp_size bound; 2**64 overflowed numpy's int64
            raise ValueError(f"{name} must be in [1, {MAX_PARALLEL}], got {value}")
    sequence_parallel = check_bool(sequence_parallel, "sequence_parallel")
    multiple = 2 * cp_size if cp_size > 1 else 1
    if sequence_parallel and tp_size > 1:
        multiple = math.lcm(multiple, tp_size * cp_size)
    return multiple


def packed_seq_params(batch: dict, *, cp_size: int = 1, tp_size: int = 1, sequence_parallel: bool = False,
                      pad_token_id: int = 0, ignore_index: int = -100):
    """A flat packkit batch (``pack_sequences(..., layout="flat")`` or a flat collator's) as Megatron THD input.

    Every segment of ``batch["cu_seq_lens_q"]`` (each document, and a padding tail if the batch has one) is
    padded at its end to :func:`megatron_pad_multiple` ``(cp_size, tp_size, sequence_parallel)``. Returns
    ``(megatron_batch, params)``:

    * ``megatron_batch``: ``tokens``, ``labels``, ``loss_mask``, ``position_ids``, each ``[1, T_padded]``, in
      Megatron's GPT convention: ``labels[i]`` is the label of token ``i + 1`` of the same document (shifted
      here, so no document predicts the next one's first token), ``loss_mask`` is 1.0 where that label counts
      (not ``ignore_index``) and 0.0 elsewhere; ignored labels and padding hold ``pad_token_id``;
      ``position_ids`` restart at 0 per document and padding continues its document's count.
    * ``params``: ``PackedSeqParams(qkv_format="thd")`` with int32 ``cu_seqlens_q/kv`` (real lengths),
      ``cu_seqlens_q/kv_padded`` (where each padded document starts; equal to the former when nothing is
      padded) and ``max_seqlen_q/kv`` (the longest padded document, a host int).

    For cp > 1 pass the whole row to every rank and take each rank's part with :func:`thd_batch_on_cp_rank`.
    """
    cls = _packed_seq_params_cls()
    multiple = megatron_pad_multiple(cp_size, tp_size, sequence_parallel)
    pad_token_id, ignore_index = check_int(pad_token_id, "pad_token_id", 0), check_int(ignore_index, "ignore_index")
    if not isinstance(batch, dict) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise TypeError("batch must be a dict with an input_ids tensor (a flat batch of packkit.pack_sequences)")
    ids_in = batch["input_ids"]
    if ids_in.dim() != 2 or ids_in.shape[0] != 1:
        raise ValueError(f"input_ids has shape {tuple(ids_in.shape)}; Megatron's THD format takes one flat row "
                         f"[1, T] (pack with layout='flat')")
    if ids_in.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"input_ids must be int32 or int64 token ids, got {ids_in.dtype}")
    check_fill(pad_token_id, ids_in.dtype, "pad_token_id")
    check_fill(ignore_index, ids_in.dtype, "ignore_index")  # compared with the labels in the ids' dtype  # int32 ids cannot hold 2**40 (torch's error named nothing)
    num_tokens = ids_in.shape[1]
    ids = ids_in.reshape(num_tokens)
    labels = batch.get("labels")
    labels = ids if labels is None else _flat_tokens(labels, ids_in.shape, "labels")
    if labels.dim() != 1:
        raise ValueError(f"labels must hold one label per token, got shape {tuple(batch['labels'].shape)}")
    if not isinstance(batch.get("cu_seq_lens_q"), torch.Tensor):
        raise ValueError("batch has no cu_seq_lens_q tensor: pack it with packkit.pack_sequences (layout='flat')")
    cu = _host_cu(batch, None, None)
    if len(cu) < 2 or int(cu[-1]) != num_tokens or np.diff(cu).min() < 0:
        raise ValueError(f"cu_seq_lens_q {cu.tolist() if len(cu) <= 12 else '[...]'} does not cut the batch's "
                         f"{num_tokens} tokens into segments")
    lengths = np.diff(cu)
    padded = (lengths + multiple - 1) // multiple * multiple
    cup = np.concatenate(([0], np.cumsum(padded))).astype(np.int64)
    total = int(cup[-1])
    if total >= 2**31:
        raise ValueError(f"the padded row holds {total} tokens (each document padded to a multiple of {multiple} for "
                         f"cp_size={cp_size}, tp_size={tp_size}); cu_seqlens are int32 (< 2^31)")

    check_padding(total, num_tokens, f"the Megatron row padded for cp_size={cp_size}, tp_size={tp_size}")
    # Where each padded position's token comes from (-1: padding), its document, and its position in it.
    seg = np.repeat(np.arange(len(padded)), padded)
    within = np.arange(total, dtype=np.int64) - cup[:-1][seg]
    real = within < lengths[seg]
    src = np.where(real, cu[:-1][seg] + within, -1)
    # The shifted label: the next token's label, inside the same document only.
    nxt = np.where(real & (within + 1 < lengths[seg]), src + 1, -1)

    device = ids.device
    src_dev, nxt_dev = (to_device(host_tensor(a), device) for a in (src, nxt))
    pad = torch.tensor(pad_token_id, dtype=ids.dtype, device=device)
    tokens = torch.where(src_dev >= 0, ids.index_select(0, src_dev.clamp(min=0)), pad)
    shifted = labels.to(ids.dtype).index_select(0, nxt_dev.clamp(min=0))
    counts = (nxt_dev >= 0) & (shifted != ignore_index)
    out = {"tokens": tokens.unsqueeze(0), "labels": torch.where(counts, shifted, pad).unsqueeze(0),
           "loss_mask": counts.to(torch.float32).unsqueeze(0),
           "position_ids": to_device(host_tensor(within), device).unsqueeze(0)}
    cu_dev = to_device(host_tensor(cu.astype(np.int32)), device)
    cup_dev = cu_dev if multiple == 1 else to_device(host_tensor(cup.astype(np.int32)), device)
    max_len = int(padded.max())
    params = cls(qkv_format="thd", cu_seqlens_q=cu_dev, cu_seqlens_kv=cu_dev, cu_seqlens_q_padded=cup_dev,
                 cu_seqlens_kv_padded=cup_dev, max_seqlen_q=max_len, max_seqlen_kv=max_len)
    return out, params


def thd_batch_on_cp_rank(batch: dict, params, cp_size: int, cp_rank: int) -> dict:
    """Context-parallel rank ``cp_rank``'s part of :func:`packed_seq_params`' batch: every padded document cut in
    ``2 * cp_size`` equal chunks, the rank keeping chunks ``cp_rank`` and ``2*cp_size-1-cp_rank`` of each, in
    document order (Transformer Engine's ``thd_get_partitioned_indices``, which Megatron's
    ``get_thd_batch_on_this_cp_rank`` calls). ``params`` is unchanged: Megatron passes the global cu_seqlens."""
    cp_size, cp_rank = check_int(cp_size, "cp_size", 1), check_int(cp_rank, "cp_rank", 0)
    if cp_size > MAX_PARALLEL:  # 2**63 - 1 overflowed numpy's int64 (found by tools/api_fuzz.py)
        raise ValueError(f"cp_size must be in [1, {MAX_PARALLEL}], got {cp_size}")
    if cp_rank >= cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")
    refuse_meta_batch(batch, "batch")
    if getattr(params, "qkv_format", None) != "thd" or params.cu_seqlens_q_padded is None:
        raise TypeError("params must be the PackedSeqParams of packed_seq_params (qkv_format='thd', padded cu_seqlens)")
    cup = params.cu_seqlens_q_padded.to("cpu", torch.int64).numpy()
    if cp_size > 1 and (np.diff(cup) % (2 * cp_size)).any():
        raise ValueError(f"documents are padded to {np.diff(cup).tolist()[:8]}..., not multiples of 2*cp_size="
                         f"{2 * cp_size}; build the batch with packed_seq_params(..., cp_size={cp_size})")
    total = int(cup[-1])
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() != 2 or value.shape[1] != total:
            raise ValueError(f"batch[{key!r}] must be a [1, {total}] tensor (the padded row of packed_seq_params)")
    if cp_size == 1:  # one rank holds everything (documents need not be even: no chunks)
        return dict(batch)
    index = _src_index_host(cup, cup, cp_size, cp_rank, True, total // cp_size)
    return {key: value.index_select(1, to_device(host_tensor(index), value.device)) for key, value in batch.items()}


def pipeline_data_iterator(microbatches, sequences, labels=None, *, cp_size: int = 1, tp_size: int = 1,
                           sequence_parallel: bool = False, pad_token_id: int = 0, ignore_index: int = -100):
    """The ``data_iterator`` of Megatron's pipeline schedules (``forward_step_func`` calls ``next`` on it once per
    micro-batch): for each micro-batch of ``microbatches`` (lists of indices into ``sequences``, in schedule order:
    one rank's ``plan_pipeline(...).microbatches[rank]``), its documents packed alone into one flat row and
    :func:`packed_seq_params`' ``megatron_batch`` with the ``PackedSeqParams`` under ``"packed_seq_params"``.

    Each micro-batch's ``cu_seqlens_q`` runs from 0 to its own tokens, and micro-batches keep their own lengths (no
    padding to the longest): with ``config.variable_seq_lengths=True`` Megatron's p2p communicator sends each
    micro-batch's activation shape first. Everything is checked before the first micro-batch is yielded."""
    from ..packing.sequences import pack_sequences
    from ..training.pipeline.microbatches import microbatch_rows

    rows = microbatch_rows(microbatches, sequences, labels)
    built = []
    for row in rows:
        flat = pack_sequences([sequences[i] for i in row], labels=None if labels is None else [labels[i] for i in row],
                              layout="flat", pad_token_id=pad_token_id, ignore_index=ignore_index)
        batch, params = packed_seq_params(flat, cp_size=cp_size, tp_size=tp_size, sequence_parallel=sequence_parallel,
                                          pad_token_id=pad_token_id, ignore_index=ignore_index)
        built.append({**batch, "packed_seq_params": params})
    return iter(built)

