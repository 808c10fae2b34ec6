"""Training FLOPs of the state-space mixers in a document of ``l`` tokens: the scan work beyond the mixer's weights
(its Linears and short convolution are counted with every other weight by ``arch_cost``). Forward + backward =
3 x forward, as everywhere in ``transformer_cost``.

**Mamba 2** (SSD, chunked: Mamba2, Bamba, Granite-4 hybrid, Nemotron-H, Falcon-H1, Zamba2), per layer: ``H`` heads
of ``P`` channels, state ``N``, ``G`` groups of B / C, chunks of ``Q``. mamba-ssm's ``mamba_chunk_scan_combined``
cuts the packed row (not each document: ``seq_idx`` masks the documents apart inside a chunk) into chunks of ``Q``,
so a document costs per token. Per chunk, multiply-adds: ``C B^T`` per group ``G Q^2 N``, ``(C B^T * decay) x`` per
head ``H Q^2 P``, the chunk's final state ``B^T x`` and the output from the incoming state ``C s`` per head
``2 H Q N P``. Elementwise, per chunk and head: the decay mask ``exp(segsum)`` and its product with ``C B^T``
(``2 Q^2``), and the state passed from chunk to chunk, ``s = exp(a) s + s_c`` (``2 P N``). Divided by ``Q``: per
token. (fla's Gated DeltaNet kernels, by contrast, chunk each ``cu_seqlens`` document on its own: ``DeltaScan``
counts the padded last chunk.)

**Mamba 1** (selective scan: Mamba, FalconMamba, Jamba), per layer of ``D`` channels and state ``N``, per token:
the output ``y = C h`` (``D N`` multiply-adds) and the recurrence ``h = exp(A dt) h + (dt B) u`` (6 elementwise
operations per state entry: ``A dt``, ``exp``, ``dt B``, ``(dt B) u``, ``exp(A dt) h``, ``+``): linear in ``l``.

transformers' torch reference of the Mamba 2 scan (which packkit's per-document stand-in runs where mamba-ssm is
absent) differs from the kernel in three places, all named in the tests that check these counts against torch's
FLOP counter: it pads each document to ``c = ceil(l / Q)`` whole chunks, repeats B and C to every head (``C B^T`` per
head, not per group), and passes the state between chunks as a ``(c + 1) x (c + 1)`` matmul where the kernel scans.

**Zamba2**'s hybrid layers each hold a copy of a shared transformer block (weights tied) with the adapters of every
hybrid layer sharing that block, and run one adapter set (their own): ``unused_adapter_macs`` takes the others out
of the weight count.

Families refused by name (``REFUSED``): no count here matches what their kernels compute, or the meta model's
weights do not say how often each runs.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# model types whose "linear_attention" layers are the Mamba mixers counted here; "hybrid" layers of Falcon-H1 run
# a Mamba 2 mixer beside full attention
SCAN_FAMILIES = ("mamba", "falcon_mamba", "jamba", "mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1",
                 "zamba2")
HYBRID_FULL_ATTENTION = ("falcon_h1", "zamba2")
REFUSED = {
    "zamba": "its Mamba 1 mixers and shared attention blocks have no validated count (Zamba2 has)",
    "kimi_linear": "its KDA layers have no validated count: transformers' torch reference computes the per-channel "
                   "decayed (query, key) products elementwise and inverts each chunk row by row, while fla's kernel "
                   "uses sub-chunk matmuls, so no FLOP count of the reference is the kernel's",
    "bailing_hybrid": "its linear-attention layers run KDA (chunk_kimi_delta_attention), which has no validated "
                      "count (see kimi_linear)",
    "rwkv": "its WKV recurrence has no validated count",
    "xlstm": "its mLSTM / sLSTM cells have no validated count",
    "recurrent_gemma": "its RG-LRU recurrence and local attention blocks have no validated count",
}


class Mamba2Scan(NamedTuple):
    heads: int
    head_dim: int
    state: int
    groups: int
    chunk: int

    def matmul_macs(self, lengths) -> np.ndarray:
        """Forward multiply-adds of the chunked scan (module docstring) for documents of ``lengths`` tokens."""
        h, p, n, g, q = (float(v) for v in self)
        return np.asarray(lengths, dtype=np.float64) * (g * q * n + h * q * p + 2 * h * n * p)

    def elementwise(self, lengths) -> np.ndarray:
        h, p, n, _, q = (float(v) for v in self)
        return np.asarray(lengths, dtype=np.float64) * h * (2 * q + 2 * p * n / q)

    def __call__(self, lengths) -> np.ndarray:
        return 3.0 * (2 * self.matmul_macs(lengths) + self.elementwise(lengths))


class DeltaScan(NamedTuple):
    """Gated DeltaNet's chunked delta rule (``arch_cost``'s docstring): ``Q (2 d_k + d_v) + 3 d_k d_v`` multiply-adds
    per head and padded token, chunks of ``Q = 64`` computed whole (fla's kernels and transformers' reference)."""
    heads: int
    d_k: int
    d_v: int
    chunk: int = 64

    def matmul_macs(self, lengths) -> np.ndarray:
        h, dk, dv, q = (float(v) for v in self)
        padded = np.ceil(np.asarray(lengths, dtype=np.float64) / q) * q
        return padded * h * (q * (2 * dk + dv) + 3 * dk * dv)

    def elementwise(self, lengths) -> np.ndarray:
        return np.zeros(np.shape(lengths))

    def __call__(self, lengths) -> np.ndarray:
        return 6.0 * self.matmul_macs(lengths)


class Mamba1Scan(NamedTuple):
    channels: int
    state: int

    def matmul_macs(self, lengths) -> np.ndarray:
        return np.asarray(lengths, dtype=np.float64) * float(self.channels * self.state)

    def elementwise(self, lengths) -> np.ndarray:
        return np.asarray(lengths, dtype=np.float64) * 6.0 * self.channels * self.state

    def __call__(self, lengths) -> np.ndarray:
        return 3.0 * (2 * self.matmul_macs(lengths) + self.elementwise(lengths))


def refusal(model_type: str):
    """Why ``transformer_cost`` has no count for ``model_type``'s mixers, or None."""
    return REFUSED.get(model_type)


def scan_of(module):
    """The scan of one mixer module (Mamba 1 or 2, read from the module's own sizes), or None for any other module."""
    names = vars(module)
    params = module._parameters
    a_log = params.get("A_log")
    if a_log is None or "ssm_state_size" not in names:
        return None
    if a_log.dim() == 1 and {"num_heads", "head_dim", "n_groups", "chunk_size"} <= set(names):
        return Mamba2Scan(int(module.num_heads), int(module.head_dim), int(module.ssm_state_size),
                          int(module.n_groups), int(module.chunk_size))
    if a_log.dim() == 2 and "x_proj" in module._modules and "dt_proj" in module._modules:
        return Mamba1Scan(int(a_log.shape[0]), int(a_log.shape[1]))
    return None


def scans(model, model_type: str, expected: int) -> list:
    """Every Mamba mixer of the (meta) ``model``; ``expected`` is how many the config's layer types say it has."""
    found = [s for s in (scan_of(m) for m in model.modules()) if s is not None]
    if len(found) != expected:
        raise ValueError(f"transformer_cost found {len(found)} Mamba mixers in {model_type}'s model where its layer "
                         f"types name {expected}; pass a cost callable")
    return found



def unused_adapter_macs(model) -> float:
    """Multiply-adds per token of adapters the meta model holds but a token does not run (module docstring): each
    Zamba2 hybrid layer's copy of a shared block lists the adapters of every layer sharing it and runs its own."""
    extra = 0.0
    for name, module in model.named_modules():
        if not name.endswith("adapter_list"):
            continue
        sizes = [sum(float(p.numel()) for p in entry.parameters() if p.dim() == 2) for entry in module]
        sizes = [size for size in sizes if size]  # nn.Identity: the slots of layers of other blocks
        if len(set(sizes)) > 1:
            raise ValueError(f"transformer_cost: the adapters of {name} differ in size ({sorted(set(sizes))}); "
                             "pass a cost callable")
        extra += sum(sizes[1:])
    return extra
