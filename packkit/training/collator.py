"""``packkit.PackingCollator``: a ``data_collator`` / ``collate_fn`` that packs each batch.

Features in (dicts with ``input_ids`` and optional ``labels`` / ``completion_mask`` /
``assistant_masks``), one packed batch out, with the keys HF models take and no ``attention_mask``.
With default options and ``layout="flat"`` the output equals transformers'
``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)``, key by key.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Optional

import numpy as np
import torch

from ..context_parallel import cp_plan_multiple, pack_context_parallel, parse_context_parallel, shard_context_parallel
from ..context_parallel.shard import CP_OUTPUT_KEYS, check_cp_capacity
from ..packing.checks import (as_device, check_bool, check_fill, check_int, check_pack_scalars, check_separator,
                              check_static_shape, integer_tokens)
from ..packing.buffers import PackBuffers
from ..packing.fields import check_pad_values, check_policy, prepare_fields
from ..packing.multimodal import mrope_spec
from ..packing.multimodal.mrope import check_mrope_start
from ..packing.sequences import check_layout, flatten_sequences, pack_sequences
from ..packing.static_shapes import check_buckets, check_max_sequences
from ..models.support import check_batch_layout
from ..planning.planner import check_plan_choices, plan as make_plan
from .block_masks import document_causal_block_mask, layer_block_masks, model_layer_types
from .planned_rows import planned_row_plan, split_planned_rows

LABEL_MASK_KEYS = ("completion_mask", "assistant_masks")


def _round_up(value: int, multiple: Optional[int]) -> int:
    return -(-value // multiple) * multiple if multiple else value


class PackingCollator:
    """Pack a list of features into one batch.

    Args:
        capacity: tokens per row. Required for ``layout="padded"``; for ``"flat"`` it only bounds
            single sequences (the ``overlong`` policy applies) and the batch keeps input order.
        layout: ``"flat"`` (``[1, T]``, default) or ``"padded"`` (``[B, capacity]``, one bin per row).
        algorithm: planner for the padded layout (default ``"obfd"``).
        overlong: ``"error"`` / ``"drop"`` / ``"truncate"`` / ``"split"`` for sequences longer than capacity.
        num_rows: fixed ``B`` for the padded layout (static shapes); a batch that needs more rows
            raises ValueError.
        pad_to_multiple_of: round the flat length (or, with ``pad_to_capacity=False``, the padded
            row length) up to a multiple, e.g. 64 for tensor cores; the tail is one padding segment.
        pad_to_capacity: padded rows are ``capacity`` long (default) or just long enough.
        separator_id: value of each sequence's first label (HF ``DataCollatorWithFlattening``'s
            option; default ``ignore_index``: no document learns the next one's first token).
            ``None`` keeps the first labels as they are.
        position_ids_start: first position id of every sequence (2 for RoBERTa-style models).
        device: pack there (``"cuda"``: pinned host buffers, non-blocking copies, device kernels).
        return_block_mask: add FlexAttention masks (built from ``seq_idx``) under ``attention_mask``, the key
            HF's flex-attention path reads them from. transformers uses a given ``BlockMask`` as is on every
            layer, so pass ``model_config=model.config``: each attention layer type gets its own mask
            (sliding window, chunks; :func:`packkit.training.block_masks.layer_block_masks`), one ``BlockMask`` or
            a ``{layer_type: BlockMask}`` mapping. Without it the mask is document-causal and raises ValueError
            when a windowed layer would use it with a document longer than the window.
        model_config: the model's config: with ``return_block_mask=True`` its layer types and windows; always, the
            batch layouts it cannot take exactly are refused at construction (ValueError naming the model type):
            the flex path where ``packkit.packing_support`` refuses it, ``context_parallel`` for recurrent /
            linear-attention models, ``layout="padded"`` for flash-linear-attention kernels (one flat row only).
        return_num_items: add ``num_items_in_batch`` (0-d int64 tensor) so the loss is normalised by tokens,
            not by rows; HF models pass it to their loss. It is exactly the targets transformers' causal-LM
            loss counts: ``labels[..., 1:] != ignore_index`` per row (each row's first label is never a
            target; a document's separator label is, from the previous document). Under context parallelism
            it is the ranks' ``shift_labels != ignore_index`` summed over all ranks (the same number on every
            rank): the sum of the ranks' losses is then the batch's mean loss.
        pad_values, extra_fields: every other feature key is packed or refused, never dropped silently
            (:mod:`packkit.fields`): per-token fields are packed like ``input_ids`` (padding
            ``pad_values.get(name, 0)``), an all-ones ``attention_mask`` is accepted and left out, vision
            inputs are concatenated in packed order, and anything else raises unless ``extra_fields`` is
            ``"drop"`` or ``"keep"`` (a list in packed order).
        mrope: a Qwen2-VL / Qwen2.5-VL / Qwen3-VL(-MoE) config or model: ``position_ids`` is ``[4, B, L]``
            (row 0 text positions, rows 1-3 each sample's mRoPE rows, as the model's ``get_rope_index``).
        reuse_buffers: pack into the collator's own :class:`packkit.PackBuffers` instead of fresh
            tensors (faster on the CPU, fixed addresses for CUDA graphs). The returned tensors are then
            **overwritten ``num_buffers`` calls later**: a batch is safe while the next
            ``num_buffers - 1`` are built. Enough for a loop that drops each batch before it asks for
            the next one after that (``num_buffers=2``). Not safe with a batch kept longer (a list of
            batches): ``.clone()`` what you keep. DataLoader workers each get their own ring, and a
            worker's buffers are shared memory with the main process, so there ``num_buffers`` must be
            at least ``prefetch_factor`` + the batches the loop holds (e.g. 4 for prefetch_factor=2 and
            a loop holding the current and previous batch; 3 was measured to corrupt that loop).
        num_buffers: size of that ring (default 2).
        context_parallel: ``(cp_size, cp_rank)`` or ``(cp_size, cp_rank, mode)`` (mode ``"zigzag"``, default,
            or ``"contiguous"``): return this context-parallel rank's shard of the packed batch
            (:func:`packkit.shard_context_parallel`: ``shift_labels``, global ``position_ids``, local
            ``cu_seq_lens_q/k``; ``num_items_in_batch`` counts all ranks' targets), built straight from the features
            in one ``cp_shard`` launch (:func:`packkit.pack_context_parallel`; with vision inputs or
            ``extra_fields="keep"`` lists: packed, then sharded). With a ``capacity``, rows are
            planned with ``pad_to_multiple_of=2 * cp_size`` in zigzag mode (capacity must be a multiple), so
            each planned row still fits once its documents are padded. Use the flat layout: in the padded
            layout every row's padding tail is padded too. Not with ``mrope`` or ``return_block_mask``.
        planned_rows: each feature is one row planned already (a list of its sample features, e.g.
            ``[ds[i] for i in row]`` for a row of ``packkit.plan(...).bins`` or ``PackedBatchSampler``; or a
            pre-packed row with ``seq_lengths``, from ``pack_dataset``), emitted as it is: one row per feature in
            the padded layout, the rows in order in the flat one; never re-planned. A row over ``capacity`` is a
            ValueError. Not with ``context_parallel``.
        max_sequences: the static-shape contract (docs/packing.md "Static shapes"): N sequence slots per row (a
            row's padding takes one), ``cu_seq_lens_q/k`` always ``num_rows * N + 1`` long (flat: ``N + 1``). Rows
            are planned with at most N - 1 documents; the flat row is ``capacity`` tokens (fixed) unless
            ``pad_to_capacity=False``. A batch with more sequences than slots is refused by name, never cut. With
            ``context_parallel``: N slots per rank shard (``cu_seq_lens_q/k`` ``N + 1`` long, as
            ``pack_context_parallel(max_sequences=N)``); the shard holds every row's segments (documents and
            padding tails, plus contiguous mode's end CP padding), decided the same on every rank.
        max_length_buckets: ``max_length_q/k`` rounded up to ``"pow2"`` buckets or a list of ints (with
            ``context_parallel``: the shard's).
    """

    def __init__(self, capacity: Optional[int] = None, *, layout: str = "flat", algorithm: str = "obfd",
                 overlong: str = "error", num_rows: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                 pad_to_capacity: bool = True, pad_token_id: int = 0, ignore_index: int = -100,
                 separator_id: Optional[int] = -100, position_ids_start: int = 0, device=None,
                 backend: str = "auto", return_block_mask: bool = False, return_num_items: bool = False,
                 input_key: str = "input_ids", label_key: str = "labels", pad_values: Optional[dict] = None,
                 extra_fields: str = "error", mrope=None, reuse_buffers: bool = False, num_buffers: int = 2,
                 context_parallel=None, model_config=None, planned_rows: bool = False,
                 max_sequences: Optional[int] = None, max_length_buckets=None):
        check_layout(layout)
        check_plan_choices(algorithm, overlong)
        for name, value in (("capacity", capacity), ("num_rows", num_rows), ("pad_to_multiple_of", pad_to_multiple_of)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if layout == "padded" and capacity is None:
            raise ValueError("layout='padded' needs capacity (the row length)")
        if num_rows is not None and layout != "padded":
            raise ValueError("num_rows applies to layout='padded' only")
        if layout == "padded" and pad_to_capacity:
            check_static_shape(num_rows or 1, capacity, "num_rows x capacity")
        self.capacity, self.layout, self.algorithm, self.overlong = capacity, layout, algorithm, overlong
        self.num_rows, self.pad_to_multiple_of, self.pad_to_capacity = num_rows, pad_to_multiple_of, pad_to_capacity
        pad_token_id, ignore_index, position_ids_start, _ = check_pack_scalars(pad_token_id, ignore_index,
                                                                              position_ids_start)
        separator_id = None if separator_id is None else check_separator(separator_id, ignore_index)
        for name, value in (("pad_to_capacity", pad_to_capacity), ("return_block_mask", return_block_mask),
                            ("return_num_items", return_num_items), ("reuse_buffers", reuse_buffers),
                            ("planned_rows", planned_rows)):
            check_bool(value, name)
        if not isinstance(input_key, str) or not isinstance(label_key, str) or input_key == label_key:
            raise ValueError(f"input_key and label_key must be two different str keys, got {input_key!r}, "
                             f"{label_key!r}")
        self.pad_token_id, self.ignore_index, self.separator_id = pad_token_id, ignore_index, separator_id
        device = None if device is None else as_device(device)
        self.position_ids_start, self.device, self.backend = position_ids_start, device, backend
        self.return_block_mask, self.return_num_items = return_block_mask, return_num_items
        if model_config is not None and return_block_mask:
            model_layer_types(model_config)  # a config without layer information fails here, not per batch
        self.model_config = model_config
        self.input_key, self.label_key = input_key, label_key

        self.pad_values, self.extra_fields = check_pad_values(pad_values), check_policy(extra_fields)
        if mrope is not None:
            mrope = mrope_spec(mrope)
        check_mrope_start(mrope, position_ids_start)
        self.mrope = mrope
        num_buffers = check_int(num_buffers, "num_buffers", 1)  # checked even when reuse_buffers=False reads none
        self.buffers = PackBuffers(num_buffers) if reuse_buffers else None
        self.context_parallel = parse_context_parallel(context_parallel)
        self._cp_multiple = cp_plan_multiple(self.context_parallel)
        if self.context_parallel is not None:
            if mrope is not None or return_block_mask:
                raise ValueError("context_parallel= does not support mrope= or return_block_mask=True")
            check_cp_capacity(self._cp_multiple, capacity)
        if planned_rows and self.context_parallel is not None:  # rows planned without the CP padding may not fit
            raise ValueError("planned_rows=True does not support context_parallel= (plan the rows with the sampler's "
                             "context_parallel= and let the collator re-plan them)")
        self.planned_rows = planned_rows
        # the static-shape contract (packing/static_shapes.py): N slots per row, bucketed max_length
        self.max_sequences, self.max_length_buckets = check_max_sequences(max_sequences), check_buckets(
            max_length_buckets)
        if model_config is not None:  # the layouts this model cannot take exactly
            check_batch_layout(model_config, layout, return_block_mask, self.context_parallel is not None)

    # -- features -> flat host tensors ----------------------------------------------------------
    def _gather(self, features):
        """(flat ids, flat labels or None, lengths, other fields), with one flatten per key for the whole batch."""
        if not isinstance(features, (list, tuple)):
            raise TypeError(f"PackingCollator expects a list of features, got {type(features).__name__}")
        ids_raw, label_raw, label_kind = [], [], []
        fields = {}
        for i, feature in enumerate(features):
            if isinstance(feature, Mapping):
                if self.input_key not in feature:
                    raise ValueError(f"feature {i} has no {self.input_key!r} key (the input_key; keys: "
                                     f"{sorted(feature)})")
                ids_raw.append(feature[self.input_key])
                kind = next((k for k in (self.label_key, *LABEL_MASK_KEYS) if feature.get(k) is not None), None)
                label_kind.append(kind)
                label_raw.append(feature[kind] if kind else None)
                for key in feature:
                    if key not in (self.input_key, self.label_key, kind) and key not in fields:
                        fields[key] = [f.get(key) if isinstance(f, Mapping) else None for f in features]
            else:
                ids_raw.append(feature)
                label_kind.append(None)
                label_raw.append(None)
        if not ids_raw:
            return torch.zeros(0, dtype=torch.int64), None, np.zeros(0, np.int64), fields
        flat_ids, lengths = flatten_sequences(ids_raw, name=self.input_key)
        if flat_ids.dim() != 1:
            raise TypeError(f"{self.input_key} must be 1-D sequences of integer token ids")
        flat_ids = integer_tokens(flat_ids, self.input_key)
        if all(k is None for k in label_kind):
            return flat_ids, None, lengths, fields
        if all(k == self.label_key for k in label_kind):
            flat_labels, label_lengths = flatten_sequences(label_raw, name=self.label_key)
            if not np.array_equal(label_lengths, lengths):
                i = int(np.flatnonzero(label_lengths != lengths)[0])
                raise ValueError(f"feature {i}: {self.label_key} has {label_lengths[i]} entries but "
                                 f"{self.input_key} has {lengths[i]}")
            return flat_ids, integer_tokens(flat_labels, self.label_key).to(torch.int64), lengths, fields
        # Mixed: labels, completion/assistant masks, or none (labels = ids) per feature.
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        parts = []
        for i, (kind, raw) in enumerate(zip(label_kind, label_raw)):
            ids = flat_ids[offsets[i]:offsets[i + 1]].to(torch.int64)
            if kind is None:
                parts.append(ids)
                continue
            values = torch.as_tensor(np.asarray(raw)) if not isinstance(raw, torch.Tensor) else raw
            if values.shape != ids.shape:
                raise ValueError(f"feature {i}: {kind} has {values.shape[0] if values.dim() else 0} entries but "
                                 f"{self.input_key} has {ids.shape[0]}")
            parts.append(integer_tokens(values, f"feature {i}: {kind}").to(torch.int64) if kind == self.label_key
                         else torch.where(values.to(torch.bool), ids, self.ignore_index))
        return flat_ids, torch.cat(parts), lengths, fields

    # -- the batch -------------------------------------------------------------------------------
    def __call__(self, features) -> dict:
        rows = None
        if self.planned_rows:
            features, rows = split_planned_rows(features, self.input_key)
        flat_ids, flat_labels, lengths, fields = self._gather(features)
        self._check_reserved(fields)
        extra = dict(fields=fields, pad_values=self.pad_values, extra_fields=self.extra_fields, mrope=self.mrope)
        mask_first = self.separator_id is not None
        plan, pack_args = self._plan(lengths, rows)
        if self.context_parallel is not None:
            token_fields = self._cp_token_fields(fields, lengths, flat_ids)
            if token_fields is not None:
                return self._fused_cp(flat_ids, flat_labels, lengths, plan, pack_args, token_fields)
        contract = {}
        if self.context_parallel is not None:  # the contract is the CP shard's (N slots per rank), not the row's
            contract = {k: pack_args.pop(k) for k in ("max_sequences", "max_length_buckets") if k in pack_args}
        batch, info = pack_sequences(flat_ids, lengths, labels=flat_labels, plan=plan, pad_token_id=self.pad_token_id,
                                     ignore_index=self.ignore_index, mask_first_label=mask_first,
                                     position_ids_start=self.position_ids_start, device=self.device,
                                     backend=self.backend, return_info=True, out=self.buffers, **pack_args, **extra)
        if mask_first and self.separator_id != self.ignore_index:
            self._set_first_labels(batch, info)
        if self.return_num_items:
            batch["num_items_in_batch"] = _packed_num_items(batch, self.ignore_index, self.context_parallel is not None)
        if self.return_block_mask:
            # The mask keeps seq_idx for attention time: a reused buffer would change under it.
            seq_idx = batch["seq_idx"] if self.buffers is None else batch["seq_idx"].clone()
            batch["attention_mask"] = (layer_block_masks(seq_idx, self.model_config) if self.model_config is not None
                                       else document_causal_block_mask(
                                           seq_idx, max_document=int(info.segments.length.max(initial=0))))
        if self.context_parallel is not None:
            cp_size, cp_rank, mode = self.context_parallel
            batch = shard_context_parallel(batch, cp_size, cp_rank, mode, pack_info=info,
                                           pad_token_id=self.pad_token_id, ignore_index=self.ignore_index, **contract)
        return batch

    def _plan(self, lengths, rows=None):
        """(plan or None, pack_sequences' layout arguments) for this batch's lengths (and given rows)."""
        given = None if rows is None else planned_row_plan(lengths, rows, self.capacity)
        if self.layout == "flat":
            plan = given if given is not None else make_plan(
                lengths, self.capacity, algorithm="nf", overlong=self.overlong,
                pad_to_multiple_of=self._cp_multiple) if self.capacity else None
            kept = plan.kept_tokens if plan is not None else int(lengths.sum())
            row_len = _round_up(kept, self.pad_to_multiple_of) if self.pad_to_multiple_of else None
            if kept == 0 and self.capacity:  # e.g. a sampler's empty last-step row: one padding row, not [1, 0]
                row_len = self.capacity
            if self.max_sequences is not None and self.capacity and self.pad_to_capacity:  # one token shape too
                if kept > self.capacity:
                    raise ValueError(f"this batch holds {kept} tokens, more than capacity={self.capacity}: with "
                                     "max_sequences the flat row is capacity tokens (a fixed shape); batch by tokens "
                                     "(a sampler with the same capacity), or pass pad_to_capacity=False")
                row_len = self.capacity
            return plan, dict(layout="flat", row_len=row_len, **self._contract())
        per_row = None if self.max_sequences is None else max(self.max_sequences - 1, 1)  # a row's padding: 1 slot
        plan = given if given is not None else make_plan(lengths, self.capacity, algorithm=self.algorithm,
                                                         overlong=self.overlong, pad_to_multiple_of=self._cp_multiple,
                                                         max_sequences=per_row)
        row_len = self.capacity
        if not self.pad_to_capacity:
            longest = int(plan.bin_tokens.max()) if plan.num_bins else 1
            row_len = min(_round_up(longest, self.pad_to_multiple_of), max(self.capacity, longest))
        num_rows = self.num_rows if self.num_rows is not None else max(plan.num_bins, 1)
        if plan.num_bins > num_rows:
            raise ValueError(f"this batch needs {plan.num_bins} rows of {self.capacity} tokens but num_rows="
                             f"{num_rows}; use fewer/shorter features per batch or a larger num_rows")
        return plan, dict(layout="padded", num_rows=num_rows, row_len=row_len, **self._contract())

    def _contract(self) -> dict:
        """The static-shape arguments, when given (under context_parallel= they apply to the rank's shard)."""
        return {k: v for k, v in (("max_sequences", self.max_sequences), ("max_length_buckets",
                                  self.max_length_buckets)) if v is not None}

    # -- context parallelism: the rank's shard straight from the features (one cp_shard launch) ------
    def _cp_token_fields(self, fields, lengths, flat_ids) -> Optional[dict]:
        """The batch's per-token fields (flat, source order) when the fused CP path can split them all, else
        None (vision inputs or extra_fields='keep' lists: pack, then shard)."""
        if not fields:
            return {}
        sorted_fields = prepare_fields(fields, lengths, flat_ids, extra_fields=self.extra_fields,
                                       pad_values=self.pad_values, mrope=None)[0]
        return None if sorted_fields.vision or sorted_fields.keep else sorted_fields.token

    def _fused_cp(self, flat_ids, flat_labels, lengths, plan, pack_args, token_fields) -> dict:
        cp_size, cp_rank, mode = self.context_parallel
        out = pack_context_parallel(
            flat_ids, cp_size, cp_rank, mode, lengths=lengths, labels=flat_labels, plan=plan,
            pad_token_id=self.pad_token_id, ignore_index=self.ignore_index,
            mask_first_label=self.separator_id is not None, separator_id=self.separator_id,
            position_ids_start=self.position_ids_start, device=self.device, backend=self.backend,
            fields=token_fields or None, pad_values=self.pad_values, **pack_args)
        if self.return_num_items:
            out["num_items_in_batch"] = _num_items(flat_ids if flat_labels is None else flat_labels, lengths, plan,
                                                   self.ignore_index, out["input_ids"].device)
        return out

    def _check_reserved(self, fields: dict) -> None:
        """A feature key this collator writes itself would be replaced silently: refuse it (pack_sequences
        refuses input_ids / labels; these are the collator's own outputs)."""
        reserved = (("num_items_in_batch",) if self.return_num_items else ()) + (
            CP_OUTPUT_KEYS if self.context_parallel is not None else ())
        clash = [k for k in reserved if k in fields]
        if clash and self.extra_fields != "drop":
            raise ValueError(f"feature key {clash[0]!r} would be replaced by the collator's own output; remove it "
                             f"from the features or pass extra_fields='drop'")
        for key in clash:
            del fields[key]

    def _set_first_labels(self, batch: dict, info) -> None:
        """Put separator_id at the first label of every real (non-padding) segment."""
        seg = info.segments
        lengths = seg.length
        starts = np.zeros(len(lengths), np.int64)
        if len(lengths):
            cumulative = np.concatenate(([0], np.cumsum(lengths)))
            if info.layout.flat:
                starts = cumulative[:-1]
            else:
                bin_of = np.repeat(np.arange(len(seg.bin_offsets) - 1), np.diff(seg.bin_offsets))
                starts = bin_of * info.layout.row_len + cumulative[:-1] - cumulative[seg.bin_offsets[:-1]][bin_of]
        labels = batch["labels"].view(-1)
        check_fill(self.separator_id, labels.dtype, "separator_id")
        labels[torch.from_numpy(starts).to(labels.device, non_blocking=True)] = self.separator_id


def _num_items(labels: torch.Tensor, lengths, plan, ignore_index: int, device) -> torch.Tensor:
    """The targets a context-parallel causal-LM loss counts over all CP ranks together (the ranks'
    ``shift_labels.ne(ignore_index)`` summed), as a 0-d int64 tensor on ``device``, from the unpacked labels
    and the plan: no packed batch needed, no host sync (the segment bounds are host ints). A segment's
    ``shift_labels`` are its labels from its second token on (its first label, separator or not, is
    never a target: the previous token's shift label is ``ignore_index`` at the document boundary)."""
    lengths = np.asarray(lengths, np.int64)
    if plan is None:
        seq = np.flatnonzero(lengths > 0)
        start, length = np.zeros(len(seq), np.int64), lengths[seq]
    else:
        seq, start, length = plan.segments.seq_index, plan.segments.start, plan.segments.length
    begin = np.concatenate(([0], np.cumsum(lengths)))[seq] + start
    counts = torch.cat((labels.new_zeros(1, dtype=torch.int64), labels.ne(ignore_index).cumsum(0)))
    second = torch.from_numpy(begin + 1).to(labels.device, non_blocking=True)
    ends = torch.from_numpy(begin + length).to(labels.device, non_blocking=True)
    return (counts[ends] - counts[second]).sum().to(device)


def _packed_num_items(batch: dict, ignore_index: int, context_parallel: bool) -> torch.Tensor:
    """The targets the model's causal-LM loss counts in a packed batch (device ops, no host sync).

    transformers' ``ForCausalLMLoss`` shifts each row's labels (``labels[..., 1:]``), so a row's first label
    is never a target while a document's first label (a separator, or the token itself with
    ``separator_id=None``) is the target of the previous document's last token. Under context parallelism
    the loss reads ``shift_labels`` instead, where every segment's last token has ``ignore_index``: there
    the count is every segment's labels from its second token on, over the whole batch (all CP ranks).
    """
    labels = batch["labels"]
    if not context_parallel:
        return labels[..., 1:].ne(ignore_index).sum()
    flat = labels.reshape(-1)
    cu = batch["cu_seq_lens_q"].to(flat.device, torch.int64)
    return flat.ne(ignore_index).sum() - flat[cu[:-1]].ne(ignore_index).sum()
