"""packkit inside ms-swift 4.6 (runs where ms-swift is importable: .ci/trainers/swift.sh): the planned packing
dataset read by ms-swift's own template collator on a tiny random Qwen2 (fp64: the packed batch's loss and
gradients equal the samples run one by one), its rows dealt by the step-shuffling BatchSamplerShard, install()."""
import os
import types

import numpy as np
import pytest
import torch

swift = pytest.importorskip("swift", reason="ms-swift is not installed (see .ci/trainers/swift.sh)")
if not hasattr(swift, "get_template"):  # a namespace package from a stray 'swift' folder, not ms-swift
    pytest.skip("ms-swift is not installed", allow_module_level=True)

from packkit.integrations.swift import PlannedBatchSamplerShard, PlannedPackingDataset  # noqa: E402

pytestmark = pytest.mark.full


SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]


def _tiny_qwen(path):
    """A tiny random Qwen2 and a byte-level Qwen2 tokenizer (no merges: one token per byte), saved offline."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import datasets

    path = tmp_path_factory.mktemp("tinyqwen")
    _tiny_qwen(path)
    model, processor = swift.get_model_processor(str(path), model_type="qwen2", torch_dtype=torch.float64,
                                                 attn_impl="sdpa", download_model=False, use_hf=True)
    template = swift.get_template(processor, template_type="qwen2_5", default_system="S", max_length=160)
    template.set_mode("train")
    # As ms-swift's trainer does (_prepare_gradient_checkpointing); without a cache, transformers builds the
    # per-document mask from the restarting position_ids (the CPU stand-in for flash-attn varlen, which swift
    # requires with --packing on a GPU).
    model.config.use_cache = False
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghij "))

    def text(n):
        return "".join(rng.choice(letters, n))

    samples = [{"messages": [{"role": "user", "content": text(rng.integers(1, 40))},
                             {"role": "assistant", "content": text(rng.integers(1, 60))}]} for _ in range(23)]
    encoded = datasets.Dataset.from_list([template.encode(s, return_length=True) for s in samples])
    return model, template, encoded, processor


def _on_rank(rank, world):
    """The sampler as rank ``rank`` of ``world`` sees it (ms-swift reads both from torch.distributed)."""
    return type("OnRank", (PlannedBatchSamplerShard,), {"rank": rank, "world_size": world})


def _token_nll(model, batch):
    """Sum of next-token NLL over labelled tokens (the loss ms-swift's trainer takes the mean of)."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits.float().double()
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    logp = torch.log_softmax(logits[:, :-1], -1)
    return -(logp.gather(-1, labels.clamp_min(0)[..., None])[..., 0] * mask).sum()


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = _token_nll(model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def test_packed_steps_through_ms_swift_collator_equal_per_sample_runs(setup):
    model, template, encoded, _ = setup
    dataset = PlannedPackingDataset(template, encoded, packing_length=160, dp_size=2, cost=(6.0 * 32, 1.0))
    assert len(dataset) % 2 == 0 and not dataset.dropped_idx
    seen = []
    for rank in range(2):
        sampler = _on_rank(rank, 2)(len(dataset), 2, True, False, 7, planned_dp_size=2)
        for batch in sampler:
            rows = [dataset[i] for i in batch]
            seen += [j for i in batch for j in dataset.packed_idx[i]]
            packed = template.data_collator(rows)  # ms-swift's padding-free collator, unchanged
            assert packed["input_ids"].shape[0] == 1
            loss, grads = _loss_and_grads(model, packed)
            ref_loss, ref_grads = 0.0, [torch.zeros_like(p) for p in model.parameters()]
            for sample in (s for row in rows for s in row):
                one_loss, one_grads = _loss_and_grads(model, template.data_collator([[sample]]))
                ref_loss = ref_loss + one_loss
                ref_grads = [r + g for r, g in zip(ref_grads, one_grads)]
            assert _rel(loss, ref_loss) <= 1e-9
            assert max(_rel(g, r) for g, r in zip(grads, ref_grads)) <= 1e-9
    assert sorted(seen) == list(range(len(encoded)))  # every sample exactly once per epoch over both ranks
    # Control: the same packed row with positions that do not restart lets documents attend to each other.
    row = template.data_collator([dataset[0]])
    assert len(dataset.packed_idx[0]) > 1
    leaky = dict(row, position_ids=torch.arange(row["input_ids"].shape[1])[None])
    assert _rel(_token_nll(model, leaky), _token_nll(model, row)) > 1e-6


def test_sampler_shuffles_steps_and_matches_ms_swift_unshuffled():
    from swift.dataloader import BatchSamplerShard

    world, n = 4, 40  # 10 planned steps of 4 rows
    for batch_size in (1, 3):
        for drop_last in (True, False):
            ours = [list(_on_rank(r, world)(n, batch_size, False, drop_last, 0, planned_dp_size=world))
                    for r in range(world)]
            theirs = [list(type("R", (BatchSamplerShard,), {"rank": r, "world_size": world})(
                n, batch_size, False, drop_last, 0)) for r in range(world)]
            assert ours == theirs
    shuffled = [list(_on_rank(r, world)(n, 2, True, True, 3, planned_dp_size=world)) for r in range(world)]
    for k in range(len(shuffled[0])):  # micro-step k: every rank holds its row of the same planned steps
        steps = [[i // world for i in shuffled[r][k]] for r in range(world)]
        assert all(s == steps[0] for s in steps)
        assert all(i % world == r for r in range(world) for i in shuffled[r][k])
    assert [i // world for b in shuffled[0] for i in b] != list(range(8))  # shuffled
    sampler = _on_rank(0, world)(n, 1, True, False, 3, planned_dp_size=world)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(map(tuple, first)) == sorted(map(tuple, list(sampler)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(planned_dp_size=2), "planned for dp_size=2 ranks but the sampler deals to 4"),
    (dict(planned_dp_size=4, group_by_length=True), "group_by_length must be False"),
])
def test_sampler_refuses_a_plan_for_other_ranks(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _on_rank(0, 4)(40, 1, True, False, 0, **kwargs)
    with pytest.raises(ValueError, match="whole steps of 4 rows"):
        _on_rank(0, 4)(42, 1, True, False, 0, planned_dp_size=4)


def test_install_swaps_sft_datasets_and_the_sampler_only_for_planned_datasets(setup):
    _, template, encoded, _ = setup
    from swift.dataloader import BatchSamplerShard
    from swift.pipelines.train import sft
    from swift.trainers import mixin
    from swift.trainers.seq2seq_trainer import Seq2SeqTrainer

    from packkit.integrations.swift import install, uninstall

    def names():
        return (sft.PackingDataset, sft.IterablePackingDataset, mixin.DataLoaderMixin.get_train_dataloader,
                Seq2SeqTrainer.compute_loss)

    own = names()
    install(dp_size=1, cost="attention")
    try:
        dataset = sft.PackingDataset(template, encoded, packing_length=160)  # what swift sft builds
        assert isinstance(dataset, PlannedPackingDataset) and dataset.dp_size == 1
        args = types.SimpleNamespace(dataloader_num_workers=0, dataloader_pin_memory=False,
                                     dataloader_persistent_workers=False, dataloader_prefetch_factor=None,
                                     dataloader_drop_last=False, train_dataloader_shuffle=True, data_seed=1,
                                     deepspeed=None, group_by_length=False, process_index=0)
        trainer = types.SimpleNamespace(template=types.SimpleNamespace(sequence_parallel_size=1), args=args,
                                        train_dataset=dataset, _train_batch_size=2,
                                        data_collator=template.data_collator,
                                        accelerator=types.SimpleNamespace(device=None),
                                        _maybe_multiprocessing_context=lambda args: {})
        loader = mixin.DataLoaderMixin.get_train_dataloader(trainer)
        assert isinstance(loader.batch_sampler, PlannedBatchSamplerShard)
        assert sum(b["input_ids"].shape[1] for b in loader) == sum(dataset.packed_length)
        trainer.train_dataset = list(range(10))  # any other dataset: ms-swift's own sampler
        loader = mixin.DataLoaderMixin.get_train_dataloader(trainer)
        assert type(loader.batch_sampler) is BatchSamplerShard
        assert mixin.BatchSamplerShard is BatchSamplerShard  # restored after the call
    finally:
        assert Seq2SeqTrainer.compute_loss is not own[3]  # the Qwen-VL text-position fix (patch.with_text_positions)
        uninstall()
    assert names() == own


class _Encoded:
    """Encoded samples as ms-swift's ``LazyLLMDataset`` serves them: ``ds[i]`` a dict (tensors kept),
    ``ds["lengths"]`` the column."""

    def __init__(self, samples):
        self.samples = samples

    def __getitem__(self, key):
        if isinstance(key, str):
            return [s[key] for s in self.samples]
        return dict(self.samples[key])

    def __len__(self):
        return len(self.samples)


def _tiny_vl(family: str, tok, ids):
    """A tiny random Qwen2.5-VL or Qwen3-VL (fp64) whose special-token ids are the tokenizer's."""
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=2, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32)
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], tie_word_embeddings=False)
    torch.manual_seed(0)
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        config = Qwen2_5_VLConfig(text_config=text,
                                  vision_config=dict(vision, fullatt_block_indexes=[0], window_size=8), **tokens)
        return Qwen2_5_VLForConditionalGeneration(config).double()
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text["rope_parameters"]["mrope_interleaved"] = True
    config = Qwen3VLConfig(text_config=text, vision_config=dict(vision, num_position_embeddings=16,
                                                                deepstack_visual_indexes=[0]), **tokens)
    return Qwen3VLForConditionalGeneration(config).double()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_qwen_vl_rows_through_ms_swift_collator_equal_per_sample_runs(setup, family):
    """Qwen2.5-VL / Qwen3-VL samples (images of different grids) packed by the plan and collated by ms-swift's
    template of that family (per-sample mRoPE rows from the model's get_rope_index, pixel_values and
    image_grid_thw concatenated in row order): loss and gradients, vision tower included, equal the samples run one
    by one (fp64). Seed 001's data is Qwen3-VL's."""
    _, _, _, processor = setup
    tok = processor  # ms-swift's processor of a text model is its tokenizer
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIAL}
    model = _tiny_vl(family, tok, ids)
    # ms-swift's template of the family. Its Qwen-VL encode needs qwen_vl_utils -> torchvision, whose PyPI wheels need
    # a CUDA torch; so samples are encoded here in the format its encode returns, and its collator is exercised.
    template = swift.get_template(processor, template_type=family, default_system="S", max_length=400)
    template.set_mode("train")
    template.model = model  # the template reads get_rope_index from its model
    rng = np.random.default_rng(3)

    def sample(h, w):  # an image of h x w patches (merged 2x2) and a short answer
        head = tok.encode("<|im_start|>user\n<|vision_start|>", add_special_tokens=False)
        prompt = head + [ids["<|image_pad|>"]] * (h * w // 4) + tok.encode(
            "<|vision_end|>" + "ab" * int(rng.integers(0, 4)) + "<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False)
        answer = tok.encode("c" * int(rng.integers(1, 9)) + "<|im_end|>", add_special_tokens=False)
        input_ids = prompt + answer
        return {"input_ids": input_ids, "labels": [-100] * len(prompt) + answer, "length": len(input_ids),
                "lengths": [len(input_ids)],
                "mm_token_type_ids": (torch.tensor(input_ids) == ids["<|image_pad|>"]).long(),
                "pixel_values": torch.randn(h * w, 3 * 2 * 2 * 2, dtype=torch.float64),
                "image_grid_thw": torch.tensor([[1, h, w]])}

    grids = [(2, 4), (4, 2), (4, 4), (2, 2), (6, 2), (2, 6), (4, 6)] * 2
    encoded = _Encoded([sample(h, w) for h, w in grids])
    dataset = PlannedPackingDataset(template, encoded, packing_length=120, dp_size=2, cost="attention")

    def nll(batch):
        positions = torch.cat([batch["text_position_ids"][None], batch["position_ids"]])  # [4, 1, T], text row first
        logits = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"],
                       image_grid_thw=batch["image_grid_thw"], mm_token_type_ids=batch["mm_token_type_ids"],
                       position_ids=positions, use_cache=False).logits
        labels = batch["labels"][:, 1:]
        logp = torch.log_softmax(logits[:, :-1], -1)
        return -(logp.gather(-1, labels.clamp_min(0)[..., None])[..., 0] * (labels != -100)).sum()

    def loss_and_grads(batch):
        model.zero_grad()
        loss = nll(batch)
        loss.backward()
        return loss.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]

    seen, multi = [], 0
    for rank in range(2):
        for batch in _on_rank(rank, 2)(len(dataset), 1, True, False, 5, planned_dp_size=2):
            row = dataset[batch[0]]
            seen += dataset.packed_idx[batch[0]]
            multi += len(row) > 1
            packed = template.data_collator([row])
            assert packed["image_grid_thw"].shape[0] == len(row)
            loss, grads = loss_and_grads(packed)
            ref = [loss_and_grads(template.data_collator([[sample]])) for sample in dataset[batch[0]]]
            assert _rel(loss, sum(r[0] for r in ref)) <= 1e-9
            assert max(_rel(g, sum(r[1][k] for r in ref)) for k, g in enumerate(grads)) <= 1e-9
    assert sorted(seen) == list(range(len(encoded))) and multi >= 2
    # Control: the same packed row with its patches out of order (pixels not following token order) differs.
    packed = template.data_collator([dataset[0]])
    with torch.no_grad():
        assert _rel(nll(dict(packed, pixel_values=packed["pixel_values"].flip(0))), nll(packed)) > 1e-6


def test_iterable_packing_planned_per_buffer(setup):
    """``--streaming true``: ms-swift's encoding workers feed each buffer; packkit plans it; every sample is yielded
    once, rows fit, and rows come in whole dispatch groups (dp_size * batch_size) until the last buffer."""
    from packkit.integrations.swift import PlannedIterablePackingDataset

    _, template, _, _ = setup
    rng = np.random.default_rng(4)
    letters = np.array(list("abcdefgh "))
    raw = [{"messages": [{"role": "user", "content": f"{i} " + "".join(rng.choice(letters, rng.integers(1, 30)))},
                         {"role": "assistant", "content": "".join(rng.choice(letters, rng.integers(1, 40)))}]}
           for i in range(40)]
    dataset = PlannedIterablePackingDataset(template, raw, num_proc=1, packing_interval=16, packing_length=160,
                                            dp_size=2, batch_size=2, cost="attention")
    try:
        rows = list(dataset)
    finally:
        for worker in dataset.workers:
            worker.terminate()
    assert all(sum(s["length"] for s in row) <= 160 for row in rows)
    texts = sorted(template.tokenizer.decode(s["input_ids"]) for row in rows for s in row)
    assert len(texts) == 40 and len(set(texts)) == 40  # every sample exactly once (each text is numbered)
    assert len(rows) >= 4


def test_plugin_file_loaded_as_ms_swift_loads_external_plugins(setup, monkeypatch):
    from swift.pipelines.train import sft
    from swift.utils import import_external_file

    import packkit.integrations.swift as integration
    from packkit.integrations.swift import uninstall

    plugin = os.path.join(os.path.dirname(integration.__file__), "plugin.py")  # not imported here: importing installs
    own = sft.PackingDataset
    monkeypatch.setenv("PACKKIT_SWIFT_DP_SIZE", "1")
    monkeypatch.setenv("PACKKIT_SWIFT_COST", "attention")
    try:
        import_external_file(plugin)  # what --external_plugins does in every rank
        _, template, encoded, _ = setup
        dataset = sft.PackingDataset(template, encoded, packing_length=160)
        assert isinstance(dataset, PlannedPackingDataset) and dataset.cost == "attention"
    finally:
        uninstall()
    assert sft.PackingDataset is own


def _dist_worker(rank, world, port, template, encoded, queue):
    """One rank of a gloo group: the planned dataset (plan on rank 0, broadcast) and ms-swift-style sampling."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        dataset = PlannedPackingDataset(template, encoded, packing_length=160, cost="attention")  # dp_size: the group
        sampler = PlannedBatchSamplerShard(len(dataset), 1, True, False, 7, planned_dp_size=dataset.dp_size)
        queue.put((rank, dataset.dp_size, dataset.packed_idx, list(sampler)))
    finally:
        dist.destroy_process_group()


def test_two_ranks_on_gloo_get_one_plan_and_their_rows_of_each_step(setup):
    import socket

    import torch.multiprocessing as mp

    _, template, encoded, _ = setup
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_dist_worker, args=(r, 2, port, template, encoded, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, rest) for r, *rest in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    (dp0, rows0, batches0), (dp1, rows1, batches1) = got[0], got[1]
    assert dp0 == dp1 == 2 and rows0 == rows1  # rank 1 received rank 0's plan
    assert len(batches0) == len(batches1) == len(rows0) // 2
    for b0, b1 in zip(batches0, batches1):  # each micro-step: rank r gets row r of the same planned step
        assert b0[0] % 2 == 0 and b1[0] == b0[0] + 1
    assert sorted(i for b in batches0 + batches1 for i in b) == list(range(len(rows0)))


def test_default_cost_is_the_model_configs_transformer_cost(setup):
    from packkit import transformer_cost
    from packkit.integrations.swift import plan_packed_idx

    _, template, encoded, _ = setup
    dataset = PlannedPackingDataset(template, encoded, packing_length=160, dp_size=2)
    assert dataset.cost is template.config
    expected = plan_packed_idx(encoded["lengths"], 160, dp_size=2, cost=transformer_cost(template.config))
    assert dataset.packed_idx == expected.packed_idx and dataset.balance == pytest.approx(expected.balance)
