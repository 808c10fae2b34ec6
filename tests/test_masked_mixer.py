"""prepare_model(model, mixer="masked") (issue 62 part 3, the hybrid family): Mamba-2's mixer kept per document by
device-side masks, no host read. Exact against each document run alone and against the per-document (host
boundary) mixer, in fp64; its kernels against an independent sequential recurrence; controls show each check can
fail (no seq_idx mask: different). The fullgraph compile of it is tests/test_masked_mixer_compile.py."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import packkit  # noqa: E402
from packkit.models.masked_mixers import masked_causal_conv1d, masked_ssd, seq_idx_of  # noqa: E402

from model_zoo import fp64_everywhere, tiny_config  # noqa: E402

pytestmark = [pytest.mark.core, pytest.mark.exactness]

EPS = torch.finfo(torch.float64).eps
LENGTHS = (5, 13, 2, 20, 9)  # chunks of 8 (tiny_config): documents shorter than, across and over a chunk
_FP64 = pytest.MonkeyPatch()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    _FP64.undo()


def _seq_idx(lengths, total):
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    return torch.cat([ids, torch.full((total - len(ids),), len(lengths))])[None]  # the padding tail: its own


def _sequential_ssd(x, dt, A, B, C, D):
    """The SSM recurrence one token at a time from a zero state: h = exp(dt A) h + dt B x^T, y = C h + D x."""
    heads, groups = x.shape[2], B.shape[2]
    B, C = (t.repeat_interleave(heads // groups, dim=2) for t in (B, C))
    h = x.new_zeros(x.shape[0], heads, x.shape[3], B.shape[3])
    out = []
    for t in range(x.shape[1]):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None]
        out.append(torch.einsum("bhpn,bhn->bhp", h, C[:, t]) + D[:, None] * x[:, t])
    return torch.stack(out, dim=1)


def test_kernels_against_each_document_alone():
    """fp64: the masked SSD and conv1d on a packed row equal the sequential recurrence / F.conv1d of each document
    alone. Tolerance: both sum at most 64 products of O(1) terms per output (the row's length), so each output's
    rounding is within 64 * eps * its magnitude; 1e3 * 64 * eps leaves room for the exp / einsum orderings."""
    g = torch.Generator().manual_seed(0)
    total, h, p, n = 64, 3, 4, 5
    seq = _seq_idx(LENGTHS, total)
    x = torch.randn(1, total, h, p, generator=g, dtype=torch.float64)
    dt = F.softplus(torch.randn(1, total, h, generator=g, dtype=torch.float64))
    A, D = -torch.rand(h, generator=g, dtype=torch.float64) - 0.1, torch.randn(h, generator=g, dtype=torch.float64)
    B, C = (torch.randn(1, total, 1, n, generator=g, dtype=torch.float64) for _ in range(2))
    got = masked_ssd(x, dt, A, B, C, D, seq)
    conv_x = torch.randn(1, 6, total, generator=g, dtype=torch.float64)
    w, bias = torch.randn(6, 1, 4, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    conv = masked_causal_conv1d(conv_x, w, bias, seq)
    tol = 1e3 * total * EPS
    start = 0
    for n_doc in (*LENGTHS, total - sum(LENGTHS)):
        s = slice(start, start + n_doc)
        want = _sequential_ssd(x[:, s], dt[:, s], A, B[:, s], C[:, s], D)
        assert torch.allclose(got[:, s], want, rtol=tol, atol=tol)
        want_conv = F.conv1d(conv_x[..., s], w, bias, padding=3, groups=6)[..., :n_doc]
        assert torch.allclose(conv[..., s], want_conv, rtol=tol, atol=tol)
        start += n_doc
    # control: without the documents (one per row) the scan and the conv run across them
    whole = torch.zeros_like(seq)
    assert not torch.allclose(masked_ssd(x, dt, A, B, C, D, whole), got, rtol=1e-3, atol=1e-3)
    assert not torch.allclose(masked_causal_conv1d(conv_x, w, bias, whole), conv, rtol=1e-3, atol=1e-3)


def test_seq_idx_from_every_boundary_form_is_the_same():
    batch = packkit.PackingCollator(64, max_sequences=8)([{"input_ids": list(range(1, n + 1))} for n in LENGTHS])
    want = batch["seq_idx"].long()
    for key in ("cu_seq_lens_q", "position_ids"):
        got = seq_idx_of({key: batch[key]}, 1, 64, "cpu", "test").long()
        same = got[:, :, None] == got[:, None, :]
        assert torch.equal(same, want[:, :, None] == want[:, None, :]), key
    assert torch.equal(seq_idx_of({}, 2, 8, "cpu", "test"), torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="seq_idx must be"):
        seq_idx_of({"seq_idx": want[:, :10]}, 1, 64, "cpu", "test")


FAMILIES = ("mamba2", "bamba")  # Bamba: the same mixer between attention layers (sdpa, documents from position_ids)


def _model(name="mamba2"):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(tiny_config(name))
    model = model.to(torch.float64).train()
    fp64_everywhere(model, _FP64)  # transformers' fp32 casts (scan, gated norm, logits) made fp64
    return model


def token_loss(logits, labels):
    """Summed next-token loss in fp64 (transformers' loss function casts logits to fp32: its 1-ulp flips would hide
    nothing and fail a fp64 tolerance)."""
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    target = labels[:, 1:]
    keep = target != -100
    return -(logp.gather(-1, target.clamp_min(0)[..., None])[..., 0] * keep).sum()


def _packed_loss(model, batch, tokens):
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return token_loss(model(**inputs, use_cache=False).logits, batch["labels"]) / tokens


def _loss_and_grads(model, run):
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


TOL = 1e3 * 64 * EPS  # the kernels' bound (above), reached through two layers and the loss
TOKENS = sum(n - 1 for n in LENGTHS)


@pytest.fixture(scope="module", params=FAMILIES)
def reference(request):
    """A family's model, the documents and their per-sample loss and gradients (summed over each alone)."""
    base = _model(request.param)
    docs = [torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in LENGTHS]

    def alone():
        return sum(token_loss(base(input_ids=torch.tensor([d]), use_cache=False).logits, torch.tensor([d]))
                   for d in docs) / TOKENS

    return base, docs, _loss_and_grads(base, alone)


def _assert_close(got, want):
    assert torch.allclose(got[0], want[0], rtol=TOL, atol=0)
    for a, b in zip(got[1], want[1]):
        assert torch.allclose(a, b, rtol=TOL, atol=TOL)


def test_packed_training_step_equals_each_document_alone_and_the_per_document_mixer(reference):
    """Loss and every gradient of a packed batch (contract form, padding tail, slots) on the masked mixer equal the
    documents run alone and the per-document path's (Mamba-2's mixer, Bamba's kernel stand-ins). Tolerance: the
    kernels' sums in another order (quadratic form vs transformers' chunked scan, shifted taps vs F.conv1d),
    through two layers."""
    base, docs, want = reference
    batch = packkit.PackingCollator(64, max_sequences=8, max_length_buckets="pow2")([{"input_ids": d} for d in docs])
    masked = packkit.prepare_model(copy.deepcopy(base), mixer="masked")
    got = _loss_and_grads(masked, lambda: _packed_loss(masked, batch, TOKENS))
    host = packkit.prepare_model(copy.deepcopy(base))
    _assert_close(got, want)
    _assert_close(got, _loss_and_grads(host, lambda: _packed_loss(host, batch, TOKENS)))
    # control: the mixer without the documents (one per row; the attention layers still get them) is not exact
    blind = {**batch, "seq_idx": torch.zeros_like(batch["seq_idx"])}
    with torch.no_grad():
        assert abs(float(_packed_loss(masked, blind, TOKENS)) - float(want[0])) > 1e-4


@pytest.mark.parametrize("form", ["padded rows", "padded rows, cu_seq_lens_q only", "cu_seq_lens_q only",
                                  "position_ids only"])
def test_every_boundary_form_and_the_padded_layout_are_exact(reference, form):
    """Documents in two padded rows (reordered by the planner; each row's tail a segment), or given to the mixer by
    cu_seq_lens_q alone (searchsorted) or restarting position_ids alone: the same per-sample loss and gradients."""
    base, docs, want = reference
    features = [{"input_ids": d} for d in docs]
    if form.startswith("padded rows"):
        batch = packkit.PackingCollator(32, layout="padded", max_sequences=4, max_length_buckets="pow2")(features)
        assert batch["input_ids"].shape[0] == 2
    else:
        batch = packkit.PackingCollator(64, max_sequences=8)(features)
    if form != "padded rows":
        keep = ("position_ids",) if form == "position_ids only" else ("cu_seq_lens_q",)
        if keep == ("cu_seq_lens_q",) and base.config.model_type == "bamba":  # its sdpa layers need positions
            keep = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids")
        batch = {k: v for k, v in batch.items() if k in ("input_ids", "labels", *keep)}
    masked = packkit.prepare_model(copy.deepcopy(base), mixer="masked")
    _assert_close(_loss_and_grads(masked, lambda: _packed_loss(masked, batch, TOKENS)), want)


def test_masked_mixer_arguments_are_checked_by_name():
    base = _model()
    with pytest.raises(ValueError, match="mixer must be one of"):
        packkit.prepare_model(base, mixer="scan")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="mixer='masked' exists for model type"):
        packkit.prepare_model(llama, mixer="masked")
    grouped = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_heads=4, head_dim=16, state_size=8, n_groups=8))
    with pytest.raises(ValueError, match="4 heads in 8 groups"):
        packkit.prepare_model(grouped, mixer="masked")
    assert packkit.models.prepared_path(grouped) is None and "forward" not in vars(grouped.backbone.layers[0].mixer)
    model = packkit.prepare_model(copy.deepcopy(base), mixer="masked")
    try:
        with pytest.raises(ValueError, match="prepared with mixer='masked'"):
            packkit.prepare_model(model)
        assert packkit.prepare_model(model, mixer="masked") is model  # idempotent
        mixer = model.backbone.layers[0].mixer
        hidden = torch.zeros(1, 4, model.config.hidden_size, dtype=torch.float64)
        with pytest.raises(ValueError, match="keyword.*no_such_option"):
            mixer(hidden, no_such_option=1)
        with pytest.raises(ValueError, match="cache is refused"):
            mixer(hidden, cache=object())
    finally:
        packkit.unprepare_model(model)
    assert "forward" not in vars(model.backbone.layers[0].mixer)


@pytest.mark.parametrize("name, mixer", [("mamba2", "per_document"), ("mamba2", "masked"), ("bamba", "per_document"),
                                         ("bamba", "masked")])
def test_a_deepcopy_of_a_prepared_model_runs_its_own_weights(name, mixer):
    """A reference / EMA model is often a deepcopy of the prepared one: its mixers must run the copy's weights (the
    closures they were ran the original's, and the copy's got no gradients), and unpreparing the copy must leave the
    original's module-level stand-ins installed."""
    model = packkit.prepare_model(_model(name), mixer=mixer)
    batch = packkit.PackingCollator(32, max_sequences=4)([{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}])
    batch.pop("labels")
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for p in copied.parameters():
            p.mul_(0.5)
    fresh = packkit.prepare_model(_model(name), mixer=mixer)
    fresh.load_state_dict(copied.state_dict())
    try:
        out = copied(**batch, use_cache=False).logits
        assert torch.equal(out, fresh(**batch, use_cache=False).logits)
        mixer_weight = next(m for m in copied.modules() if type(m).__name__.endswith("Mixer")).in_proj.weight
        assert torch.autograd.grad(out.sum(), mixer_weight)[0].abs().sum() > 0
        packkit.unprepare_model(copied)
        model(**batch, use_cache=False)  # still prepared: the stand-ins it counts in are kept
    finally:
        for m in (model, copied, fresh):
            packkit.unprepare_model(m)
