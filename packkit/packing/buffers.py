"""``packkit.PackBuffers``: output buffers that :func:`packkit.pack_sequences` (``out=``) and
``PackingCollator(reuse_buffers=True)`` reuse across calls instead of allocating every batch.

Why: a packed batch is written once, right after allocation, so with fresh buffers every token pays a
page fault (CPU) or an allocator round trip; warm, reused memory is several times faster to fill on
the CPU, and CUDA graphs want outputs at fixed addresses. Batches are packed with the out-variant
``packkit::pack_batch_out`` into views of buffers kept here.

Aliasing contract (read this before holding on to a batch): a ring of ``num_buffers`` buffer sets
is used round-robin, so the tensors a call returns are **overwritten by the call ``num_buffers``
later**. With ``num_buffers=2`` the batch you are training on stays intact while the next one is
packed. Anything that keeps a batch longer (a list of batches, a DataLoader queue of prefetched
batches, a CUDA stream other than the one packing) needs a larger ring, or ``.clone()``. In DataLoader
workers the buffers become shared memory that the main process maps, so a worker's next batches
write into tensors the training loop already holds: use ``num_buffers >= prefetch_factor`` + the
batches the loop holds (tested in tests/test_buffer_reuse.py).
"""
from __future__ import annotations

import numbers
from typing import Callable, Optional

import torch

# Names of the six pack_batch_out outputs, in the op's order.
_OUTPUTS = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens", "cu_seg")


class PackBuffers:
    """A ring of ``num_buffers`` sets of pack outputs, reused when dtype and device match.

    Each set keeps one flat storage per output and hands out a contiguous prefix view of the shape
    a batch needs, so batches of varying size share memory; a storage is replaced only when a batch
    needs more elements (it then grows by at least 25%), another dtype or another device.
    ``allocations`` counts (re)allocations, e.g. to check that a steady state allocates nothing.
    """

    def __init__(self, num_buffers: int = 1):
        if isinstance(num_buffers, bool) or not isinstance(num_buffers, numbers.Integral) or num_buffers < 1:
            raise ValueError(f"num_buffers must be a positive int, got {num_buffers!r}")
        self.num_buffers = int(num_buffers)
        self.allocations = 0
        self._slots: list[dict[str, torch.Tensor]] = [{} for _ in range(self.num_buffers)]
        self._next = 0
        self._last: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (cu_seqlens, cu_seg) of the last call

    def __repr__(self) -> str:
        held = sum(t.numel() * t.element_size() for slot in self._slots for t in slot.values())
        return f"PackBuffers(num_buffers={self.num_buffers}, bytes={held}, allocations={self.allocations})"

    def __getstate__(self):
        # Pickled with a collator into DataLoader workers: ship the configuration, not the memory.
        return {"num_buffers": self.num_buffers}

    def __setstate__(self, state):
        self.__init__(state["num_buffers"])

    def release(self) -> None:
        """Drop every buffer (the memory returns to the allocator once returned batches are gone)."""
        self.__init__(self.num_buffers)

    def _view(self, slot: dict, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = 1
        for d in shape:
            numel *= int(d)
        buf = slot.get(name)
        if buf is None or buf.dtype != dtype or buf.device != device or buf.numel() < numel:
            grown = numel if buf is None or buf.dtype != dtype or buf.device != device else max(
                numel, buf.numel() + buf.numel() // 4)
            buf = torch.empty(grown, dtype=dtype, device=device)
            slot[name] = buf
            self.allocations += 1
        return buf[:numel].view(shape)

    def pack_batch_outputs(self, shape: tuple, num_cu_seqlens: int, ids_dtype: torch.dtype,
                           labels_dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
        """The next set in the ring as ``pack_batch_out`` outputs: input_ids, labels, position_ids
        (int64), seq_idx (int32) of ``shape``; cu_seqlens int32 [n]; cu_seg int32 [n - 1]."""
        device = torch.device(device)
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self.num_buffers
        dtypes = (ids_dtype, labels_dtype, torch.int64, torch.int32)
        outs = [self._view(slot, name, tuple(shape), dtype, device) for name, dtype in zip(_OUTPUTS, dtypes)]
        outs.append(self._view(slot, "cu_seqlens", (num_cu_seqlens,), torch.int32, device))
        outs.append(self._view(slot, "cu_seg", (num_cu_seqlens - 1,), torch.int32, device))
        return tuple(outs)

    def packer(self, pack_batch_out) -> Callable:
        """A function with ``packkit::pack_batch``'s signature that packs into the next buffer set
        with ``pack_batch_out`` (the op of the chosen backend) and returns the same five tensors."""

        def pack_batch(input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, num_rows,
                       row_len, flat, num_cu_seqlens, *options):
            shape = (row_len,) if flat else (num_rows, row_len)
            label_dtype = input_ids.dtype if labels is None else labels.dtype
            outs = self.pack_batch_outputs(shape, num_cu_seqlens, input_ids.dtype, label_dtype, input_ids.device)
            pack_batch_out(input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, flat, *outs,
                           *options)
            self._last = (outs[4], outs[5])
            return outs[:5]

        return pack_batch

    def cu_seg_of(self, cu_seqlens: torch.Tensor) -> Optional[torch.Tensor]:
        """The layout's cu_seg written together with ``cu_seqlens`` by the last call, else None."""
        if self._last is not None and self._last[0] is cu_seqlens:
            return self._last[1]
        return None
