"""The guard every stage runs on its micro-batch's boundaries before attention reads them.

torch.distributed.pipelining chunks every tensor argument of ``schedule.step`` along dim 0. A batch-wide 1-D
``cu_seqlens`` (all documents of the step, offsets into the whole batch) chunks into pieces such as ``[7, 10]``:
offsets into another micro-batch's tokens. torch's CUDA varlen kernel reads them as addresses (torchtitan PR 4098:
an illegal memory access); here the piece is refused by name before any kernel sees it."""
from __future__ import annotations

import numpy as np
import torch

HINT = ("build per-micro-batch metadata with packkit.training.pipeline.pipeline_microbatches (a (m, N + 1) "
        "cu_seq_lens whose dim-0 chunks are each micro-batch's own), never a batch-wide cu_seqlens that "
        "torch.distributed.pipelining chunks along dim 0 (torchtitan PR 4098)")


def check_microbatch(cu_seq_lens: torch.Tensor, tokens: int, position_ids=None, name: str = "cu_seq_lens"):
    """``cu_seq_lens`` of one micro-batch as a 1-D int64 host array, after checking that it is that micro-batch's
    own: it starts at 0, never falls, and ends at its ``tokens``; with ``position_ids`` ([1, tokens] or [tokens]),
    that every document's positions restart at its offset. Anything else is a ValueError naming it."""
    if not isinstance(cu_seq_lens, torch.Tensor) or cu_seq_lens.is_floating_point():
        raise TypeError(f"{name} must be an integer tensor, got {type(cu_seq_lens).__name__}"
                        f"{'' if not isinstance(cu_seq_lens, torch.Tensor) else ' of ' + str(cu_seq_lens.dtype)}")
    if cu_seq_lens.dim() == 2 and cu_seq_lens.shape[0] == 1:  # one dim-0 chunk of the (m, N + 1) form
        cu_seq_lens = cu_seq_lens[0]
    if cu_seq_lens.dim() != 1 or cu_seq_lens.numel() < 2:
        raise ValueError(f"{name} of shape {tuple(cu_seq_lens.shape)} is not one micro-batch's boundaries "
                         f"(1-D, or (1, N + 1), at least 2 offsets); {HINT}")
    host = cu_seq_lens.detach().to("cpu", torch.int64).numpy()
    shown = host.tolist()[:8] + (["..."] if host.size > 8 else [])
    if host[0] != 0:
        raise ValueError(f"{name} = {shown} starts at {host[0]}, not 0: a slice of a batch-wide cu_seqlens; {HINT}")
    if (np.diff(host) < 0).any():
        raise ValueError(f"{name} = {shown} falls (offsets must never decrease); {HINT}")
    if host[-1] != tokens:
        raise ValueError(f"{name} = {shown} ends at {host[-1]}, not at this micro-batch's {tokens} tokens: "
                         f"boundaries of another batch; {HINT}")
    if position_ids is not None:
        pos = position_ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
        if pos.size != tokens:
            raise ValueError(f"position_ids has {pos.size} tokens, the micro-batch {tokens}; {HINT}")
        starts = host[:-1][np.diff(host) > 0]
        if (pos[starts] != pos[0]).any():
            bad = int(starts[np.argmax(pos[starts] != pos[0])])
            raise ValueError(f"position_ids do not restart at offset {bad} of {name}: positions of another "
                             f"packing; {HINT}")
    return host
