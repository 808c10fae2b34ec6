"""packkit.prepare_model / unprepare_model / packing_support (issue 50): reversible, idempotent, never half-patched;
with the kernel packages present the batch's boundaries reach the real kernels unchanged (fake kernel modules that
record their arguments); PackingCollator(model_config=) refuses the layouts a model cannot take. Exactness of every
family on every path is the model zoo's (tests/test_model_zoo.py)."""
from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import packkit  # noqa: E402
from packkit.models import kernels as pk_kernels  # noqa: E402
from packkit.models.support import modeling_modules  # noqa: E402

from model_zoo import fp64_everywhere, tiny_config  # noqa: E402
from transformers.integrations import hub_kernels  # noqa: E402

pytestmark = [pytest.mark.core, pytest.mark.exactness]

FEATURES = [{"input_ids": list(range(3, 16))}, {"input_ids": [5, 6, 7, 8, 9, 10, 11, 12]}, {"input_ids": [4, 3]}]


_FP64 = pytest.MonkeyPatch()  # fp64_everywhere's patches, undone when the module's tests end


def build(name: str, train: bool = False):
    """A tiny fp64 model, fp64 everywhere: transformers' fp32 casts (Qwen3-Next's gated norm computes
    silu(gate.float())) would put 1-2 fp32 ulp, CPU-dependent (AVX-512's tail path), into the exact comparisons."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(tiny_config(name), attn_implementation="eager",
                                                              experts_implementation="eager")
    if getattr(model, "_supports_sdpa", False):
        model.set_attn_implementation("sdpa")
    model = model.to(torch.float64).train(train)
    fp64_everywhere(model, _FP64)
    return model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add contention
    yield
    torch.set_num_threads(threads)
    _FP64.undo()


def module_state(model) -> dict:
    return {(m.__name__, k): v for m in modeling_modules(model) for k, v in vars(m).items() if callable(v)}


def per_sample_logits(model, features):
    return torch.cat([model(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0] for f in features])


def test_prepare_is_idempotent_and_reversible():
    model = build("qwen3_5_text")
    before = module_state(model)
    assert packkit.prepare_model(model) is model
    patched = module_state(model)
    changed = {k for k in before if before[k] is not patched[k]}
    assert {k[1] for k in changed} == {"causal_conv1d_fn", "torch_chunk_gated_delta_rule",
                                       "torch_recurrent_gated_delta_rule"}
    packkit.prepare_model(model)  # again: nothing more
    assert module_state(model) == patched
    other = build("qwen3_5_text")
    packkit.prepare_model(other)  # a second model shares the module's stand-ins
    packkit.unprepare_model(model)
    assert module_state(model) == patched  # still in use by `other`
    packkit.unprepare_model(other)
    assert module_state(model) == before
    packkit.unprepare_model(other)  # again: nothing to do
    assert not model._forward_pre_hooks and not hasattr(model, "_packkit_prepared")


def test_refused_model_is_not_patched():
    model = build("qwen3_5_text")
    before = module_state(model)
    with pytest.raises(ValueError, match=r"model type 'qwen3_5_text' cannot be packed exactly on the 'shared_prefix' "
                                         r"path: its recurrent"):
        packkit.prepare_model(model, path="shared_prefix")
    assert module_state(model) == before and not model._forward_pre_hooks


def test_unknown_stand_in_signature_is_refused_before_patching(monkeypatch):
    model = build("qwen3_5_text")
    before = module_state(model)
    spec = pk_kernels.SPECS["causal_conv1d_fn"]
    monkeypatch.setitem(pk_kernels.SPECS, "causal_conv1d_fn", spec._replace(tokens={"x": 2}))
    with pytest.raises(ValueError, match="has no argument 'x'"):
        packkit.prepare_model(model)
    assert module_state(model) == before


def test_mixers_are_reversible():
    model = build("mamba")
    packkit.prepare_model(model)
    mixers = [m for m in model.modules() if type(m).__name__ == "MambaMixer"]
    assert mixers and all("forward" in vars(m) for m in mixers)
    packkit.unprepare_model(model)
    assert all("forward" not in vars(m) for m in mixers) and not model._forward_pre_hooks


def test_bad_arguments():
    with pytest.raises(TypeError, match="transformers model"):
        packkit.prepare_model(object())
    with pytest.raises(ValueError, match="path must be one of"):
        packkit.prepare_model(build("llama"), path="dense")
    with pytest.raises(TypeError, match="model or config"):
        packkit.packing_support(3)
    model = build("llama")
    model.config._attn_implementation = "my_attention"
    with pytest.raises(ValueError, match="'my_attention' is not a packing path"):
        packkit.prepare_model(model)


def test_packing_support_table():
    table = packkit.packing_support(tiny_config("qwen3_5_text"))
    assert table.model_type == "qwen3_5_text"
    assert table["position_ids"].status == "exact after prepare_model"
    assert table["shared_prefix"].status == "refused" and "flex_attention" in table
    assert "qwen3_5_text" in str(table)
    assert packkit.packing_support(build("qwen3_5_text")) == table  # a model and its config agree
    assert packkit.packing_support(tiny_config("llama"), "position_ids").status == "exact"
    assert packkit.packing_support(tiny_config("opt"), "position_ids").status == "refused"
    assert packkit.packing_support(tiny_config("gpt_oss"), "packkit_varlen").status == "exact"


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4"])
def test_sparse_attention_indexer_is_refused_where_it_gets_no_mask(model_type):
    """The survey: DeepSeek Sparse Attention's indexer slices the 4-D mask transformers builds for sdpa / eager only
    (a TypeError deep inside the model on packkit_varlen and the shared-prefix attention): refused by name there."""
    table = packkit.packing_support(transformers.AutoConfig.for_model(model_type))
    for path in ("packkit_varlen", "shared_prefix"):
        assert table[path].status == "refused" and "sparse-attention indexer" in table[path].why
    assert table["position_ids"].ok


def test_unverified_model_type_warns():
    config = transformers.LlamaConfig(**{k: v for k, v in tiny_config("llama").to_dict().items()
                                         if k in ("vocab_size", "hidden_size", "num_hidden_layers")})
    config.model_type = "my_llama"
    model = transformers.LlamaForCausalLM(config)
    assert packkit.packing_support(model)["position_ids"].status == "unverified"
    with pytest.warns(UserWarning, match="not in packkit's model zoo"):
        packkit.prepare_model(model)
    packkit.unprepare_model(model)


def test_packed_position_ids_without_boundaries_are_refused():
    model = build("qwen3_5_text")
    packkit.prepare_model(model)
    try:
        batch = packkit.PackingCollator()(FEATURES)
        with pytest.raises(ValueError, match="without cu_seq_lens_q / seq_idx"):
            model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        model(input_ids=batch["input_ids"][:, :5], use_cache=False)  # not packed: runs
    finally:
        packkit.unprepare_model(model)


@pytest.mark.parametrize("name, layout", [("bamba", "flat"), ("bamba", "padded"), ("mamba", "padded"),
                                          ("qwen3_next", "flat")])
def test_training_mode_and_padded_rows_are_exact(name, layout):
    """Training mode (Bamba's fused split-conv1d-scan entry, dropout 0) and the padded layout (documents in several
    rows, each row's tail a padding segment) against each sample alone."""
    model = build(name, train=True)
    want = per_sample_logits(model, FEATURES)
    packkit.prepare_model(model)
    try:
        collate = packkit.PackingCollator(16, layout=layout) if layout == "padded" else packkit.PackingCollator()
        batch = collate(FEATURES)
        batch.pop("labels")
        logits = model(**batch, use_cache=False).logits.reshape(-1, want.shape[-1])
        cu = batch["cu_seq_lens_q"].tolist()
        got = {}
        for a, b in zip(cu, cu[1:]):
            got[b - a] = got.get(b - a, []) + [logits[a:b]]
        parts = [got[len(f["input_ids"])].pop(0) for f in FEATURES]
        assert torch.allclose(torch.cat(parts), want, rtol=0, atol=1e-12)
    finally:
        packkit.unprepare_model(model)


# -- the real kernels: fake packages that record what reaches them -------------------------------------------
def _fake_packages(monkeypatch, module, calls, cpu_supported=True):
    """Install fake causal_conv1d / fla packages and re-decorate ``module``'s torch references with transformers'
    own decorator, as an import with the packages present would have; the fakes record their keyword arguments and
    compute each document with the torch reference (so the model runs). From transformers 5.25 a package's kernel
    runs only on the devices it lists: ``cpu_supported`` lists the CPU, as a GPU would be, or leaves it out."""
    conv_ref = pk_kernels.torch_reference(module.causal_conv1d_fn)
    delta_ref = pk_kernels.torch_reference(module.torch_chunk_gated_delta_rule)
    devices = getattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES", None)
    if devices is not None:
        monkeypatch.setattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES", {
            package: (*listed, "cpu") if cpu_supported else listed for package, listed in devices.items()})

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        calls.append(("causal_conv1d_fn", dict(seq_idx=seq_idx)))
        spans = pk_kernels.document_spans({"seq_idx": seq_idx}, x.shape[0], x.shape[-1], "fake") or [
            (r, 0, x.shape[-1]) for r in range(x.shape[0])]
        parts = [conv_ref(x[r:r + 1, :, a:b], weight, bias, activation) for r, a, b in spans]
        return torch.cat(parts, dim=-1)

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False):
        calls.append(("chunk_gated_delta_rule", dict(cu_seqlens=cu_seqlens)))
        spans = pk_kernels.document_spans({"cu_seqlens": cu_seqlens}, q.shape[0], q.shape[1], "fake") or [
            (r, 0, q.shape[1]) for r in range(q.shape[0])]
        parts = [delta_ref(q[r:r + 1, a:b], k[r:r + 1, a:b], v[r:r + 1, a:b], g=g[r:r + 1, a:b], beta=beta[r:r + 1, a:b],
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)[0] for r, a, b in spans]
        return torch.cat(parts, dim=1), None

    monkeypatch.setitem(sys.modules, "causal_conv1d", types.SimpleNamespace(causal_conv1d_fn=causal_conv1d_fn))
    def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                         cu_seqlens=None, use_qk_l2norm_in_kernel=False):
        raise AssertionError("decoding kernel called in training")

    monkeypatch.setitem(sys.modules, "fla", types.SimpleNamespace(
        chunk_gated_delta_rule=chunk_gated_delta_rule, fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule))
    deco = hub_kernels.use_kernel_func_from_hub_with_fallback
    monkeypatch.setattr(module, "causal_conv1d_fn", deco("causal_conv1d_fn", "causal_conv1d")(conv_ref))
    monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", deco("chunk_gated_delta_rule", "fla")(delta_ref))
    monkeypatch.setattr(module, "torch_recurrent_gated_delta_rule", deco("fused_recurrent_gated_delta_rule", "fla")(
        pk_kernels.torch_reference(module.torch_recurrent_gated_delta_rule)))


def test_real_kernels_get_the_batch_boundaries_unchanged(monkeypatch):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as module

    calls = []
    _fake_packages(monkeypatch, module, calls)
    model = build("qwen3_5_text")
    want = per_sample_logits(model, FEATURES)
    calls.clear()
    table = packkit.packing_support(model)
    # the kernels keep the documents apart: nothing to install, or (transformers >= 5.25) a stand-in for the devices
    # the packages do not run on
    per_device = any(k.devices is not None for k in packkit.models.support.analyse(model).kernels)
    assert table["position_ids"].status == ("exact after prepare_model" if per_device else "exact")
    before = module_state(model)
    packkit.prepare_model(model)
    try:
        # nothing installed, or (transformers >= 5.25: kernels per device) stand-ins that hand a supported
        # device's call on unchanged
        changed = {k for k, v in module_state(model).items() if v is not before[k]}
        assert all(hasattr(module_state(model)[k], "__packkit_original__") for k in changed)
        batch = packkit.PackingCollator()(FEATURES)
        batch.pop("labels")
        logits = model(**batch, use_cache=False).logits[0]
    finally:
        packkit.unprepare_model(model)
    names = {name for name, _ in calls}
    assert names == {"causal_conv1d_fn", "chunk_gated_delta_rule"}
    for name, args in calls:
        if name == "causal_conv1d_fn":
            assert args["seq_idx"] is batch["seq_idx"]
        else:
            assert args["cu_seqlens"] is batch["cu_seq_lens_q"]
    assert torch.allclose(logits, want, rtol=0, atol=1e-12)


def test_real_kda_kernel_gets_cu_seqlens(monkeypatch):
    """Kimi-Linear's layers pass the batch's cu_seq_lens_q but no cu_seqlens to chunk_kda; with the real kernel
    prepare_model hands it on (without it the kernel would see one sequence per row)."""
    from transformers.models.kimi_linear import modeling_kimi_linear as module

    seen = []

    def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        seen.append(cu_seqlens)
        return torch.zeros_like(v), None

    monkeypatch.setitem(sys.modules, "fla", types.SimpleNamespace(chunk_kda=chunk_kda))
    reference = pk_kernels.torch_reference(module.chunk_kimi_delta_attention)
    devices = getattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES", None)
    if devices is not None:  # the fake fla runs on the CPU, as the real one on a GPU
        monkeypatch.setitem(hub_kernels._PACKAGE_SUPPORTED_DEVICES, "fla", (*devices.get("fla", ()), "cpu"))
    monkeypatch.setattr(module, "chunk_kimi_delta_attention",
                        hub_kernels.use_kernel_func_from_hub_with_fallback("chunk_kda", "fla")(reference))
    conv = module.causal_conv1d_fn
    model = build("kimi_linear")
    batch = packkit.PackingCollator()(FEATURES)
    batch.pop("labels")
    packkit.prepare_model(model)
    try:
        assert module.causal_conv1d_fn is not conv  # no causal_conv1d package: the per-document stand-in
        model(**batch, use_cache=False)
    finally:
        packkit.unprepare_model(model)
    assert seen and all(cu is batch["cu_seq_lens_q"] for cu in seen)
    assert module.causal_conv1d_fn is conv
    seen.clear()  # control: unprepared, the real kernel gets no boundaries (transformers' conv refuses first: skip it)
    pk = pk_kernels.per_document(next(k for k in pk_kernels.hub_kernels(module) if k.attr == "causal_conv1d_fn"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "causal_conv1d_fn", pk)
        model(**batch, use_cache=False)
    assert seen and all(cu is None for cu in seen)


def test_packages_installed_but_not_for_this_device_run_per_document(monkeypatch):
    """transformers >= 5.25 with causal_conv1d / fla installed and CPU inputs: its wrapper takes the torch path,
    which refuses a packed call; prepare_model's stand-in runs it per document (exact), and the package's kernel is
    never reached."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as module

    if not hasattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES"):
        pytest.skip("this transformers runs an installed package's kernel on every device")
    calls = []
    _fake_packages(monkeypatch, module, calls, cpu_supported=False)
    model = build("qwen3_5_text")
    want = per_sample_logits(model, FEATURES)
    batch = packkit.PackingCollator()(FEATURES)
    batch.pop("labels")
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):  # control: unprepared
        model(**batch, use_cache=False)
    packkit.prepare_model(model)
    try:
        logits = model(**batch, use_cache=False).logits[0]
    finally:
        packkit.unprepare_model(model)
    assert not calls
    assert torch.allclose(logits, want, rtol=0, atol=1e-12)


def test_every_family_that_needs_stand_ins_gets_them():
    """Each model type of the zoo whose recurrent layers packkit runs per document: after prepare_model, every
    hub-kernel name its modules bind is a packkit stand-in, and the packed forward equals per-sample (so a
    transformers release that hides the names from packkit fails here, not in a user's run)."""
    from packkit.models.verdicts import MIXERS, STAND_INS_VERIFIED

    for name in sorted(STAND_INS_VERIFIED - set(MIXERS)):
        try:
            config = tiny_config(name)
        except KeyError:  # not in this zoo's config table
            continue
        info = packkit.models.support.analyse(config)
        assert info.kernels, f"{name}: no hub-kernel name found in its modules"
        if name not in ("qwen3_5_text", "falcon_h1", "kimi_linear"):
            continue  # the forwards: one of each kernel family (delta rule, Mamba2 scan, KDA); the rest by the zoo
        model = build(name)
        packkit.prepare_model(model)
        try:
            needed = [k for k in info.kernels if k.name in pk_kernels.SPECS]
            assert needed and all(hasattr(getattr(k.module, k.attr), "__packkit_original__") for k in needed), name
            batch = packkit.PackingCollator()(FEATURES)
            batch.pop("labels")
            logits = model(**batch, use_cache=False).logits[0]
        finally:
            packkit.unprepare_model(model)
        assert torch.allclose(logits, per_sample_logits(model, FEATURES), rtol=0, atol=1e-12), name


def test_a_family_whose_kernels_are_hidden_is_refused(monkeypatch):
    """The guard: a family known to need stand-ins whose modules show packkit no hub-kernel name (a decorator this
    packkit does not recognise) is refused by name, not packed through the torch reference."""
    monkeypatch.setattr(pk_kernels, "_WRAPPER_CODES", frozenset())
    model = build("qwen3_5_text")
    with pytest.raises(ValueError, match="found none of transformers' hub-kernel functions"):
        packkit.prepare_model(model)


# -- PackingCollator(model_config=) ------------------------------------------------------------------------------
def test_collator_refuses_layouts_the_model_cannot_take():
    config = tiny_config("qwen3_5_text")
    with pytest.raises(ValueError, match=r"model type 'qwen3_5_text' cannot take layout='padded': its linear-attention"):
        packkit.PackingCollator(16, layout="padded", model_config=config)
    with pytest.raises(ValueError, match=r"cannot take context_parallel"):
        packkit.PackingCollator(16, context_parallel=(2, 0), model_config=config)
    with pytest.raises(ValueError, match=r"cannot take return_block_mask=True \(the flex_attention path\)"):
        packkit.PackingCollator(return_block_mask=True, model_config=config)
    with pytest.raises(ValueError, match=r"model type 'mamba' cannot take context_parallel"):
        packkit.PackingCollator(16, context_parallel=(2, 0), model_config=tiny_config("mamba"))
    batch = packkit.PackingCollator(model_config=config)(FEATURES)  # flat: taken
    assert batch["input_ids"].shape == (1, 23) and "attention_mask" not in batch
    packkit.PackingCollator(16, layout="padded", model_config=tiny_config("bamba"))  # Mamba2 kernels take rows
    packkit.PackingCollator(16, context_parallel=(2, 0), model_config=tiny_config("llama"))


# -- trainer integrations: prepare_model is called where the trainer first holds the model -------------------
def test_llamafactory_hook_prepares_the_model(monkeypatch):
    """LLaMA-Factory's patched train sampler prepares the model of a packkit-planned train set (fake llamafactory
    modules: the real package runs in the trainer CI stage)."""
    from packkit.integrations.llamafactory import hook
    from packkit.integrations.llamafactory.dataset import MARKER

    class Trainer:
        def _get_train_sampler(self, *args, **kwargs):
            return "llamafactory's sampler"

    loader = types.SimpleNamespace(_get_preprocessed_dataset=lambda *a, **k: None)
    trainer_mod = types.SimpleNamespace(CustomSeq2SeqTrainer=Trainer)
    monkeypatch.setattr(hook, "_modules", lambda: (loader, trainer_mod))
    monkeypatch.setattr(hook, "_SAVED", {})
    hook.install()

    class Planned(list):
        info = types.SimpleNamespace(description=MARKER)

    trainer = Trainer()
    trainer.train_dataset = Planned([1, 2])
    trainer.model = build("opt")
    with pytest.raises(ValueError, match=r"model type 'opt' cannot be packed exactly on the 'position_ids' path"):
        trainer._get_train_sampler()
    trainer.model = build("qwen3_5_text")
    trainer.train_dataset = [1, 2]
    assert trainer._get_train_sampler() == "llamafactory's sampler"  # not planned: untouched
    assert not hasattr(trainer.model, "_packkit_prepared")
    trainer.train_dataset = Planned([1, 2])
    trainer._get_train_sampler()
    assert packkit.models.prepared_path(trainer.model) == "position_ids"
    packkit.unprepare_model(trainer.model)
    del trainer.model  # a trainer stand-in without a model (the trainer stages' own tests): nothing to prepare
    trainer._get_train_sampler()


def test_docs_models_table_is_packing_support():
    """docs/models.md's verdict table is what packing_support says for the zoo's model types."""
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("model_zoo_table", root / "tools" / "model_zoo_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = (root / "docs" / "models.md").read_text()
    start, end = text.index(tool.MODELS[0]) + len(tool.MODELS[0]), text.index(tool.MODELS[1])
    assert text[start:end].strip("\n") == tool.models_table(), "run: python tools/model_zoo_table.py --models"
