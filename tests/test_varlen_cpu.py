"""``packkit_varlen`` on the CPU: packkit's per-document attention (``packkit.training.doc_attention``), the helper the
shared-prefix two-pass path runs too.

* The helper against an independent dense reference (the whole ``T x T`` score matrix with a block-diagonal,
  causal, windowed / chunked mask, soft-cap and sink), fp64, values and gradients (sink included), for random
  document lengths (hypothesis); ``gradcheck`` on a small case; fp32 / bf16 / fp16 within their precision.
* Controls: the same comparison flags boundaries off by one token, a dropped window, chunk, soft-cap or sink.
* Cost: the CPU flash kernel only ever sees one document (profiler shapes), never the row's square.
* Through HF models: a padded ``PackingCollator`` batch (several rows, padding segments) equals every sample run
  alone (log-probs and parameter gradients, fp64); bf16 trains (finite loss and gradients, close to fp64).
  The model zoo (tests/test_model_zoo.py) runs every architecture's varlen column on this path.
"""
from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit.shared_prefix.attention import two_pass
from packkit.training import doc_attention as da
from packkit.training import doc_attention_cpu as dac
from packkit.training import hf_attention

pytestmark = [pytest.mark.core, pytest.mark.exactness]

transformers = pytest.importorskip("transformers")


def dense_reference(q, k, v, lengths, scale, causal=True, window=None, chunk=None, softcap=None, sink=None):
    """``[T, H, D]`` attention through the whole ``T x T`` score matrix (fp64 math), masked to the documents."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    starts = torch.repeat_interleave(torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)[:-1])),
                                     torch.tensor(lengths))
    pos = torch.arange(len(doc)) - starts  # position inside the document
    seen = doc[:, None] == doc[None, :]
    if causal:
        seen &= pos[None, :] <= pos[:, None]
    if window is not None:
        seen &= pos[:, None] - pos[None, :] < window
    if chunk is not None:
        seen &= pos[:, None] // chunk == pos[None, :] // chunk
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~seen, float("-inf"))
    if sink is not None:  # one extra logit per head in every row's softmax, no value
        s = torch.cat([s, sink[:, None, None].expand(-1, s.shape[1], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :len(doc)]
    return torch.einsum("hqk,khd->qhd", p, v)


def _inputs(lengths, heads=3, dim=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    return [torch.randn(t, heads, dim, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _spans(lengths, causal=True):
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    return da.spans(cu, causal=causal)


def _rel(a, b, floor=1e-300):
    """Max error relative to the reference's largest entry, or to ``floor`` if larger (a gradient that is 0 in exact
    math, e.g. a one-token document's dq, is rounding noise in both: the helper's inputs are O(1))."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def _compare(lengths, seed=0, causal=True, window=None, chunk=None, softcap=None, sink=False, spans_of=None):
    """Max relative error of output and of the gradients (q, k, v, sink) against the dense reference."""
    q, k, v = _inputs(lengths, seed=seed)
    s = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1)).requires_grad_() \
        if sink else None
    scale = 0.4
    out = da.doc_attention(q, k, v, (spans_of or _spans)(lengths, causal), scale, softcap, s, window, chunk)
    leaves = [q, k, v] + ([s] if sink else [])
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad_out, allow_unused=True)  # a lost sink (control) gets None
    got = [torch.zeros_like(t) if g is None else g for g, t in zip(got, leaves)]
    ref = dense_reference(q, k, v, lengths, scale, causal, window, chunk, softcap, s)
    want = torch.autograd.grad(ref, leaves, grad_out)
    return max([_rel(out, ref, 1.0)] + [_rel(a, b, 1.0) for a, b in zip(got, want)])


LENGTHS = st.lists(st.integers(1, 19), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None)
@given(lengths=LENGTHS, seed=st.integers(0, 1000), causal=st.booleans(),
       window=st.none() | st.integers(1, 8), chunk=st.none() | st.integers(1, 8),
       softcap=st.none() | st.floats(0.5, 5.0), sink=st.booleans(), grouped=st.booleans())
def test_doc_attention_equals_dense_reference_fp64(lengths, seed, causal, window, chunk, softcap, sink, grouped):
    """``grouped``: documents of similar length share one padded kernel call (the default; every length here is
    short enough), else one call per document."""
    if not causal:
        window = chunk = None  # defined for causal layers only (refused otherwise: below)
    with mock.patch.object(dac, "_SMALL", dac._SMALL if grouped else 0), \
            mock.patch.object(dac, "_SLACK", dac._SLACK if grouped else -1.0):
        assert _compare(lengths, seed, causal, window, chunk, softcap, sink) <= 1e-12


@pytest.mark.parametrize("bug", ["boundary", "window", "chunk", "softcap", "sink"])
def test_control_the_comparison_flags_each_lost_feature(monkeypatch, bug):
    """Each feature the helper implements, lost on its way (or a document boundary one token off), turns the
    same comparison from <= 1e-12 into a visible error."""
    lengths, kw = [7, 5, 9], dict(window=3, chunk=4, softcap=1.5, sink=True)
    assert _compare(lengths, **kw) <= 1e-12
    if bug == "boundary":
        error = _compare(lengths, **kw, spans_of=lambda ls, causal: _spans([ls[0] + 1, ls[1] - 1] + ls[2:]))
    else:  # the autograd function gets the call without the feature (forward and backward lose it)
        apply, at = da._DocAttention.apply, {"sink": 3, "softcap": 6, "window": 7, "chunk": 8}[bug]

        def losing(*args):
            args = list(args)
            args[at] = None
            return apply(*args)
        monkeypatch.setattr(da._DocAttention, "apply", losing)
        error = _compare(lengths, **kw)
    assert error > 1e-3, error


def test_gradcheck_with_window_softcap_and_sink():
    lengths = [3, 1, 4]
    q, k, v = (t.detach()[:, :2, :2].clone().requires_grad_() for t in _inputs(lengths))
    sink = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    p = _spans(lengths)
    assert torch.autograd.gradcheck(lambda a, b, c, s: da.doc_attention(a, b, c, p, 0.6, 1.2, s, 3), (q, k, v, sink))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)])
def test_low_precision_is_close_to_fp64(dtype, tol):
    lengths = [37, 5, 64, 1, 20]
    q, k, v = _inputs(lengths, heads=4, dim=16)
    p = _spans(lengths)
    ref = dense_reference(q, k, v, lengths, 0.25, window=11)
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = da.doc_attention(*low, p, 0.25, window=11)
    assert out.dtype == dtype
    grad_out = torch.randn_like(ref)
    out.backward(grad_out.to(dtype))
    want = torch.autograd.grad(ref, (q, k, v), grad_out)
    assert _rel(out.double(), ref) <= tol
    for a, b in zip(low, want):
        assert a.grad.dtype == dtype and _rel(a.grad.double(), b) <= 4 * tol


def test_a_query_with_no_keys_folds_a_sink_into_zero_not_nan(monkeypatch):
    """FlashAttention (CUDA fp16 / bf16) writes lse = +inf for a query with no key, the CPU and matmul paths -inf: a
    sink folded into either must give out 0 and lse' = sink (the sink takes all the mass), with finite gradients. Fed
    here as flash feeds it: the CPU forward's -inf turned into +inf; the control is the unguarded merge (NaN)."""
    out = torch.randn(3, 2, 4, dtype=torch.float64)
    lse = torch.tensor([[0.5, float("inf"), float("-inf")], [1.5, float("inf"), float("-inf")]], dtype=torch.float64)
    sink = torch.tensor([0.3, -0.7], dtype=torch.float64)
    got, merged = da.with_sink(out, lse, sink)
    assert torch.equal(got[1:], torch.zeros_like(got[1:])) and torch.equal(merged[:, 1:], sink[:, None].expand(2, 2))
    assert torch.allclose(got[0], out[0] * torch.sigmoid(lse[:, 0] - sink)[:, None])
    control = torch.logaddexp(lse, sink[:, None])  # the merge before the guard
    assert (out * torch.exp(lse - control).transpose(0, 1)[..., None])[1].isnan().all()
    # Through doc_attention: document 1 has 2 queries and no key (cu_k repeats), non-causal.
    cu_q, cu_k = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 4, 4], dtype=torch.int32)
    p = da.spans(cu_q, cu_k, causal=False)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 2, 8, dtype=torch.float64, generator=g)
    k, v = (torch.randn(4, 2, 8, dtype=torch.float64, generator=g) for _ in range(2))
    sink = sink.clone()

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sink)]
        o = da.doc_attention(*leaves[:3], p, 0.4, sink=leaves[3])
        o.backward(torch.ones_like(o))
        return [o.detach()] + [t.grad for t in leaves]

    want = run()
    forward = da.varlen_forward

    def flash_like(*args, **kw):
        o, l = forward(*args, **kw)
        return o, l.masked_fill(l == float("-inf"), float("inf"))
    monkeypatch.setattr(da, "varlen_forward", flash_like)
    got = run()
    assert torch.equal(got[0][3:], torch.zeros(2, 2, 8, dtype=torch.float64))
    for a, b in zip(got, want):
        assert not a.isnan().any() and torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_helper_refusals():
    q, k, v = _inputs([3, 4])
    p = _spans([3, 4])
    with pytest.raises(ValueError, match="causal attention only"):
        da.doc_attention(q, k, v, _spans([3, 4], causal=False), 1.0, window=2)
    with pytest.raises(ValueError, match="window must be a positive int or None; got 0"):
        da.doc_attention(q, k, v, p, 1.0, window=0)
    with pytest.raises(ValueError, match="sink must have shape \\(3,\\)"):
        da.doc_attention(q, k, v, p, 1.0, sink=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="softcap must be > 0"):
        da.doc_attention(q, k, v, p, 1.0, softcap=-1.0)


def test_one_implementation_for_both_attentions():
    """The shared-prefix two-pass path runs the very functions packkit_varlen's CPU kernel does."""
    assert two_pass.varlen_forward is da.varlen_forward and two_pass.varlen_backward is da.varlen_backward
    assert two_pass.with_sink is da.with_sink and hf_attention.doc_attention is da.doc_attention


def test_the_kernel_sees_only_documents():
    """Cost ~ sum(l^2): every CPU flash call (forward and backward) is one document, or documents of similar length
    padded to the longest of them (3 short ones here), never the whole row."""
    lengths = [300, 20, 700, 5, 999, 24]
    q, k, v = _inputs(lengths, heads=2, dim=8, dtype=torch.float32)
    with torch.profiler.profile(record_shapes=True) as prof:
        da.doc_attention(q, k, v, _spans(lengths), 0.3).sum().backward()
    seen = {"fwd": [], "bwd": []}
    for e in prof.events():
        if e.name == "aten::_scaled_dot_product_flash_attention_for_cpu":
            seen["fwd"].append(tuple(e.input_shapes[0][::2]))  # (documents, length) of the [n, H, L, D] query
        elif e.name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
            seen["bwd"].append(tuple(e.input_shapes[1][::2]))
    calls = [(1, 999), (1, 700), (1, 300), (3, 24)]
    assert sorted(seen["fwd"]) == sorted(seen["bwd"]) == sorted(calls)


@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40))
def test_group_lengths_bounds_the_padded_work(lengths):
    groups = dac.group_lengths(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        top = max(lengths[i] for i in g)
        assert lengths[g[0]] == top
        useful = sum(lengths[i] ** 2 for i in g)
        assert len(g) * top ** 2 <= (1 + dac._SLACK) * useful + dac._SMALL
    assert len(dac.group_lengths([64] * 30)) == 1 and len(dac.group_lengths([2048, 1024])) == 2


# --- through HF models ------------------------------------------------------------------------------------------
def _llama(dtype=torch.float64, **overrides):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, use_cache=False, **overrides)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)


SEQS = [[3, 9, 4, 17, 22, 5, 8], [11, 2, 6], [7, 30, 12, 1, 9, 40, 41, 2, 8], [5], [60, 61, 62, 63, 1, 2]]


def _token_logp(logits, ids):
    return torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]


def _per_sample(model):
    model.zero_grad(set_to_none=True)
    parts = [_token_logp(model(input_ids=torch.tensor([s]), use_cache=False).logits[0], torch.tensor(s))
             for s in SEQS]
    torch.cat(parts).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return torch.cat(parts).detach(), grads


def _packed(model, batch):
    model.zero_grad(set_to_none=True)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    flat_logits, flat_ids = logits.reshape(-1, logits.shape[-1]), batch["input_ids"].reshape(-1)
    cu = batch["cu_seq_lens_q"].tolist()
    parts, seen = {}, 0
    for a, b in zip(cu, cu[1:]):  # real documents are the segments whose ids match a sample (padding: zeros)
        ids = flat_ids[a:b].tolist()
        if ids in SEQS and SEQS.index(ids) not in parts:
            parts[SEQS.index(ids)] = _token_logp(flat_logits[a:b], flat_ids[a:b])
            seen += 1
    assert seen == len(SEQS)
    logp = torch.cat([parts[i] for i in range(len(SEQS))])
    logp.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logp.detach(), grads


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_hf_llama_packed_equals_per_sample_fp64(layout):
    """Every document's log-probs and every parameter's gradient, packed (flat, or padded rows whose padding is
    its own segment) vs each sample run alone with SDPA."""
    model = _llama()
    ref_logp, ref_grads = _per_sample(model)
    model.set_attn_implementation(packkit.register_varlen_attention())
    collate = packkit.PackingCollator(16, layout=layout)
    batch = collate([{"input_ids": s} for s in SEQS])
    if layout == "padded":
        assert batch["input_ids"].shape[0] > 1
    logp, grads = _packed(model, batch)
    assert _rel(logp, ref_logp) <= 1e-10
    for name, g in grads.items():
        assert _rel(g, ref_grads[name]) <= 1e-9, name


def test_hf_llama_bf16_trains_close_to_fp64():
    model64 = _llama()
    batch = packkit.PackingCollator(64)([{"input_ids": s} for s in SEQS])
    name = packkit.register_varlen_attention()
    model64.set_attn_implementation(name)
    ref = model64(**batch, use_cache=False).loss
    model = _llama(torch.bfloat16)
    model.set_attn_implementation(name)
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.dtype == torch.bfloat16 and math.isfinite(float(loss))
    assert abs(float(loss) - float(ref)) <= 2e-2 * float(ref)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_hf_llama_position_ids_only_equals_the_cu_seq_lens_batch(layout):
    """A call with only per-document ``position_ids`` (ms-swift's / TRL's padding-free collators give no
    ``cu_seq_lens``): boundaries from the restarting positions, the same logits and gradients as the batch's own
    ``cu_seq_lens_q`` (which the test above proves equal to per-sample runs); control: positions that never restart
    (one document per row) differ; mRoPE rows without ``cu_seq_lens_q`` are refused by name."""
    model = _llama()
    model.set_attn_implementation(packkit.register_varlen_attention())
    batch = packkit.PackingCollator(16, layout=layout)([{"input_ids": s} for s in SEQS])

    def run(**kw):
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=batch["input_ids"], use_cache=False, **kw).logits
        logits.square().sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    ref_logits, ref_grads = run(**{k: v for k, v in batch.items() if k not in ("input_ids", "labels")})
    logits, grads = run(position_ids=batch["position_ids"])
    assert torch.equal(logits, ref_logits) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    length = batch["input_ids"].shape[1]
    leak, _ = run(position_ids=torch.arange(length).expand(batch["input_ids"].shape[0], length))
    assert _rel(leak, ref_logits) > 1e-6
    with pytest.raises(ValueError, match="packkit_varlen on model type 'llama'.*position_ids of shape \\(3, "):
        hf_attention.varlen_attention_forward(
            model.model.layers[0].self_attn, *(torch.zeros(1, 4, 5, 8),) * 3, None,
            position_ids=torch.zeros(3, 1, 5, dtype=torch.long))
