"""Pipeline stages of an HF Llama-family causal LM, split by layers: the first stage holds the embeddings, the last
the final norm and ``lm_head``; each stage's module is what ``torch.distributed.pipelining.PipelineStage`` wraps.

Metadata is rebuilt per stage, not carried: every rank passes the step's ``position_ids`` / ``cu_seq_lens`` to its
own ``schedule.step`` as keyword arguments (the schedule hands a stage's kwargs to that stage only, chunked like
the inputs), and each stage recomputes its rotary table from them. Carried through stage outputs, integer tensors
would travel point-to-point beside the activations and take part in the stage backward's bookkeeping; as kwargs
they cost nothing to send (every rank knows the plan) and each stage checks its chunk (``check_microbatch``)."""
from __future__ import annotations

import numpy as np
import torch

from ...planning.arg_rules import Int, check_args
from .guard import check_microbatch


def split_layers(num_layers: int, num_stages: int) -> list:
    """``num_stages`` contiguous ``(start, stop)`` layer ranges, sizes differing by at most one (earlier stages
    take the extra layers)."""
    layers, stages = check_args(Int("num_layers", 1), Int("num_stages", 1, num_layers), values=(num_layers, num_stages))
    base, extra = divmod(layers, stages)
    bounds = np.cumsum([0] + [base + (i < extra) for i in range(stages)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class LlamaStage(torch.nn.Module):
    """Layers ``start:stop`` of ``model`` (a ``LlamaForCausalLM``-shaped model: ``model.model.embed_tokens /
    layers / norm / rotary_emb`` and ``model.lm_head``), with the embeddings if ``start == 0`` and the norm and head
    if ``stop`` is the last layer. ``forward(x, position_ids, cu_seq_lens=None)``: token ids (first stage) or hidden
    states in, hidden states or logits out. With ``cu_seq_lens`` (one micro-batch's, checked) the layers' attention
    gets ``cu_seq_lens_q/k`` and ``max_length_q/k`` (attn_implementation "packkit_varlen"); without, the rows are
    plain causal rows (a padded batch, attn_implementation "sdpa")."""

    def __init__(self, model: torch.nn.Module, start: int, stop: int):
        super().__init__()
        total = len(model.model.layers)
        start, stop = check_args(Int("start", 0, total - 1), Int("stop", start + 1, total), values=(start, stop))
        self.first, self.last = start == 0, stop == total
        self.embed_tokens = model.model.embed_tokens if self.first else None
        self.layers = torch.nn.ModuleList(model.model.layers[start:stop])
        self.rotary_emb = model.model.rotary_emb
        self.norm = model.model.norm if self.last else None
        self.lm_head = model.lm_head if self.last else None
        owned = {id(p) for p in self.parameters()}
        # the full model's name of each parameter, to compare gradients with the unsplit model's
        self.full_names = {id(p): n for n, p in model.named_parameters() if id(p) in owned}

    def named_full_parameters(self):
        return [(self.full_names[id(p)], p) for p in self.parameters()]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, cu_seq_lens=None) -> torch.Tensor:
        h = self.embed_tokens(x) if self.first else x
        attention = {}
        if cu_seq_lens is not None:
            if h.shape[0] != 1:
                raise ValueError(f"a packed micro-batch is one row; got {h.shape[0]} rows (pass (m, T) tensors to "
                                 "schedule.step with n_microbatches = m)")
            host = check_microbatch(cu_seq_lens, h.shape[1], position_ids)
            cu = torch.as_tensor(host, dtype=torch.int32)
            longest = int(np.diff(host).max())
            attention = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        rotary = self.rotary_emb(h, position_ids=position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_ids=position_ids, position_embeddings=rotary,
                      use_cache=False, **attention)
        if self.last:
            h = self.lm_head(self.norm(h))
        return h
