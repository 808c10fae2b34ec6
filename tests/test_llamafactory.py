"""packkit's LLaMA-Factory drop-in against LLaMA-Factory 0.9.5 itself (runs in .ci/trainers/llamafactory.sh's venv,
skipped where llamafactory is not importable):

* rows equal, column for column, what ``PackedSupervisedDatasetProcessor`` writes for the same row membership;
* ``pack_dataset``: every example exactly once (hypothesis), document ids past int8 kept;
* exactness through ``SFTDataCollatorWith4DAttentionMask`` (``neat_packing``'s 4-D block mask, sdpa attention):
  a tiny fp64 Llama's summed loss and gradients over the packed rows equal the per-example runs (rel <= 1e-9),
  with a control (the same rows under a plain causal mask) that the check catches;
* ``install()``: the dataset loader path (``get_dataset``) and the trainer's sampler, restored by ``uninstall()``.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

collator_mod = pytest.importorskip("llamafactory.data.collator")
datasets = pytest.importorskip("datasets")
from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor  # noqa: E402
from llamafactory.data.template import TEMPLATES  # noqa: E402
from llamafactory.hparams import DataArguments  # noqa: E402

from packkit.integrations import llamafactory as lf  # noqa: E402

pytestmark = pytest.mark.full

IGNORE = -100
VOCAB = 64


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def examples(lengths, seed=0):
    """Unpacked examples as SupervisedDatasetProcessor writes them; token 3 + i % 60 opens example i."""
    rng = np.random.default_rng(seed)
    out = {"input_ids": [], "attention_mask": [], "labels": [], "images": [], "videos": [], "audios": []}
    for i, n in enumerate(lengths):
        ids = [3 + i % 60] + rng.integers(3, VOCAB, n - 1).tolist()
        prompt = int(rng.integers(1, n + 1))  # the first label is always a prompt token, as with LF's templates
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * n)
        out["labels"].append([IGNORE] * prompt + ids[prompt:])
        for m in ("images", "videos", "audios"):
            out[m].append(None)
    return out


@pytest.mark.parametrize("neat", [True, False])
def test_rows_equal_llamafactorys_processor(neat):
    lengths = [17, 5, 30, 9, 12, 3, 26, 8, 21, 14]
    ex = examples(lengths)
    args = DataArguments(cutoff_len=40, neat_packing=neat, packing=True)
    proc = PackedSupervisedDatasetProcessor(template=TEMPLATES["default"], tokenizer=tokenizer(), processor=None,
                                            data_args=args)
    proc._encode_data_example = lambda prompt, **_: (ex["input_ids"][prompt[0]], ex["labels"][prompt[0]])
    raw = {"_prompt": [[i] for i in range(len(lengths))], "_response": [[None]] * len(lengths),
           **{k: [None] * len(lengths) for k in ("_system", "_tools", "_images", "_videos", "_audios")}}
    theirs = proc.preprocess_dataset(raw)
    # their rows' membership, read back from the opening token of each document (position 0, not padding)
    rows = []
    for ids, pos in zip(theirs["input_ids"], theirs["position_ids"]):
        end = len(ids) - _padding(ids)  # real tokens are >= 3, padding is 0
        rows.append([ids[k] - 3 for k in range(end) if pos[k] == 0])
    assert args.cutoff_len == 39  # LLaMA-Factory takes one off with packing; its rows are cutoff_len + 1 long
    ours = lf.build_rows(ex, rows, cutoff_len=args.cutoff_len, neat_packing=neat, pad_token_id=0)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert {k: list(v) for k, v in theirs.items()} == ours


def _padding(ids):
    k = 0
    while k < len(ids) and ids[-1 - k] == 0:
        k += 1
    return k


def dataset_of(lengths, seed=0):
    return datasets.Dataset.from_dict(examples(lengths, seed))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.integers(1, 70), min_size=1, max_size=60), st.integers(1, 4), st.booleans())
def test_pack_dataset_every_example_once(lengths, dp_size, neat):
    ds = dataset_of(lengths)
    packed, plan = lf.pack_dataset(ds, 63, neat_packing=neat, pad_token_id=0, dp_size=dp_size, cost="attention")
    assert lf.is_planned(packed) and not lf.is_planned(ds)
    assert len(packed) == len(plan.rows)
    seen = []
    for row, plan_row in zip(packed, plan.rows):
        assert len(row["input_ids"]) == 64 and len(row["labels"]) == 64 and len(row["position_ids"]) == 64
        starts = [k for k, p in enumerate(row["position_ids"]) if p == 0 and row["input_ids"][k] != 0]
        seen += [row["input_ids"][k] - 3 for k in starts]
        # the row's tokens are its examples' tokens in plan order, then padding
        expect = [t for i in plan_row for t in ds[int(i)]["input_ids"]]
        assert row["input_ids"][:len(expect)] == expect and set(row["input_ids"][len(expect):]) <= {0}
    # example ids mod 60 (the opening token), each example once: compare as multisets
    assert sorted(seen) == sorted(i % 60 for i in range(len(lengths)) if lengths[i] <= 63)


def test_document_ids_past_int8():
    """200 documents in one row: neat_packing's ids 1..200 survive (datasets would store a column named
    attention_mask as int8; LLaMA-Factory patches datasets for that, packkit writes it under another name)."""
    ds = dataset_of([1] * 200)
    packed, _ = lf.pack_dataset(ds, 255, neat_packing=True, pad_token_id=0)
    assert len(packed) == 1
    mask = packed[0]["attention_mask"]
    assert mask[:200] == list(range(1, 201)) and set(mask[200:]) == {0}


def test_pack_dataset_errors():
    ds = dataset_of([3, 4])
    with pytest.raises(TypeError, match="map-style datasets.Dataset"):
        lf.pack_dataset(ds.to_iterable_dataset(), 8, neat_packing=True, pad_token_id=0)
    with pytest.raises(ValueError, match=r"lacks the columns \['labels'\]"):
        lf.pack_dataset(ds.remove_columns("labels"), 8, neat_packing=True, pad_token_id=0)
    with pytest.raises(TypeError, match="neat_packing must be a bool"):
        lf.pack_dataset(ds, 8, neat_packing=1, pad_token_id=0)
    with pytest.raises(TypeError, match="pad_token_id must be an int"):
        lf.pack_dataset(ds, 8, neat_packing=True, pad_token_id=None)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    # sdpa: transformers 5.6's eager attention takes its softmax in float32, where the 4-D mask's float64 minimum
    # is -inf, so padding rows (every key masked) give NaN that reaches every position through the values
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(torch.float64).eval()


def summed_loss(model, batch) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                   position_ids=batch.get("position_ids")).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1),
                                             ignore_index=IGNORE, reduction="sum")


def grads(model, loss_fn):
    model.zero_grad()
    loss = loss_fn()
    loss.backward()
    return loss.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_exact_through_llamafactorys_4d_mask_collator():
    lengths = [23, 7, 41, 12, 30, 5, 18, 36, 9, 27, 14, 3]
    ds = dataset_of(lengths, seed=1)
    packed, plan = lf.pack_dataset(ds, 63, neat_packing=True, pad_token_id=0, dp_size=2, rows_per_rank=2,
                                   cost="attention")
    collate = collator_mod.SFTDataCollatorWith4DAttentionMask(
        template=TEMPLATES["default"], tokenizer=tokenizer(), model=None, label_pad_token_id=IGNORE,
        block_diag_attn=True, attn_implementation="sdpa", compute_dtype=torch.float64, neat_packing=True)
    batches = [collate([copy.deepcopy(packed[k]) for k in range(i, min(i + 2, len(packed)))])
               for i in range(0, len(packed), 2)]
    assert batches[0]["attention_mask"].shape == (2, 1, 64, 64) and batches[0]["attention_mask"].dtype == torch.float64
    model = tiny_llama()
    loss, grad = grads(model, lambda: sum(summed_loss(model, b) for b in batches))
    ref_loss, ref_grad = grads(model, lambda: sum(summed_loss(model, {
        "input_ids": torch.tensor([ds[i]["input_ids"]]), "labels": torch.tensor([ds[i]["labels"]])})
        for i in range(len(lengths))))
    assert abs(loss - ref_loss) <= 1e-9 * abs(ref_loss)
    assert (grad - ref_grad).norm() <= 1e-9 * ref_grad.norm()
    # control: the same rows under a plain causal mask attend across documents, which the check catches
    leaky = [dict(b, attention_mask=None) for b in batches]
    leak_loss, _ = grads(model, lambda: sum(summed_loss(model, b) for b in leaky))
    assert abs(leak_loss - ref_loss) > 1e-6 * abs(ref_loss)


def _toy_dataset_dir(tmp_path, n=80, seed=0):
    rng = np.random.default_rng(seed)
    words = lambda k: " ".join(f"t{x}" for x in rng.integers(3, VOCAB, k))  # noqa: E731
    rows = [{"instruction": words(rng.integers(1, 25)), "input": "", "output": words(rng.integers(1, 40))}
            for _ in range(n)]
    (tmp_path / "toy.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"toy": {"file_name": "toy.json"}}))
    return tmp_path


def _get_dataset(tmp_path, **data):
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import ModelArguments
    from transformers import Seq2SeqTrainingArguments

    tok = tokenizer()
    data_args = DataArguments(dataset="toy", dataset_dir=str(tmp_path), template="default", overwrite_cache=True,
                              **data)
    training_args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                                             report_to=[], seed=3)
    template = get_template_and_fix_tokenizer(tok, data_args)
    return get_dataset(template, ModelArguments(model_name_or_path=str(tmp_path)), data_args, training_args, "sft",
                       tok)["train_dataset"]


def _documents(packed):
    """Every document of a neat-packed dataset, split at its packing_params boundaries (padding left out)."""
    docs = []
    for row in packed:
        b = row["packing_params"]["sequence_boundaries"]
        docs += [tuple(row["input_ids"][b[k]:b[k + 1]]) for k in range(len(b) - 2)]  # the last span is padding
    return docs


def test_install_plans_llamafactorys_own_loader(tmp_path):
    from llamafactory.train.sft import trainer as sft_trainer

    _toy_dataset_dir(tmp_path)
    plain = _get_dataset(tmp_path, cutoff_len=64)  # LLaMA-Factory's unpacked examples (cutoff 64, as packing's 63+1)
    theirs = _get_dataset(tmp_path, cutoff_len=64, neat_packing=True)
    original_sampler = sft_trainer.CustomSeq2SeqTrainer._get_train_sampler
    lf.install(cost="tokens")
    try:
        ours = _get_dataset(tmp_path, cutoff_len=64, neat_packing=True)
        assert lf.is_planned(ours) and not lf.is_planned(theirs)
        assert sorted(ours.column_names) == sorted(theirs.column_names)
        assert all(len(r) == 64 for r in ours["input_ids"])
        examples_63 = sorted(tuple(x) for x in _get_dataset(tmp_path, cutoff_len=63)["input_ids"])
        assert sorted(_documents(ours)) == examples_63 == sorted(_documents(theirs))  # each example once
        assert len(ours) <= len(theirs)
        sampler = sft_trainer.CustomSeq2SeqTrainer._get_train_sampler(
            type("T", (), {"train_dataset": ours})())
        assert isinstance(sampler, torch.utils.data.SequentialSampler)
        from llamafactory.data import loader

        streaming = DataArguments(cutoff_len=64, neat_packing=True)
        streaming.streaming = True
        with pytest.raises(ValueError, match="streaming=False"):
            args = type("TrainingArgs", (), {"predict_with_generate": False})()
            loader._get_preprocessed_dataset(dataset_of([3]), streaming, args, "sft", None, None)
    finally:
        lf.uninstall()
    assert sft_trainer.CustomSeq2SeqTrainer._get_train_sampler is original_sampler
    assert not lf.is_planned(_get_dataset(tmp_path, cutoff_len=64, neat_packing=True))
    assert len(plain) == 80


def test_install_through_llamafactorys_run_exp(tmp_path):
    """LLaMA-Factory's own training entry (run_exp: its parser, loader, collator, CustomSeq2SeqTrainer) on CPU with
    install(): the trainer's dataloader holds the planned rows, sampled in the plan's order, and 2 steps train."""
    from llamafactory.train.tuner import run_exp
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

    _toy_dataset_dir(tmp_path, n=40)
    tokenizer().save_pretrained(tmp_path / "model")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 pad_token_id=0, eos_token_id=2)).save_pretrained(tmp_path / "model")
    seen = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            seen["dataset"] = train_dataloader.dataset
            seen["first"] = next(iter(train_dataloader))["input_ids"]

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.setdefault("losses", []).append((logs or {}).get("loss"))

    lf.install(cost="tokens")
    try:
        run_exp(dict(model_name_or_path=str(tmp_path / "model"), stage="sft", do_train=True, finetuning_type="full",
                     dataset="toy", dataset_dir=str(tmp_path), template="default", cutoff_len=64, neat_packing=True,
                     output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2, logging_steps=1,
                     report_to="none", flash_attn="sdpa", use_cpu=True, save_strategy="no", overwrite_cache=True),
                callbacks=[Probe()])
    finally:
        lf.uninstall()
    ds = seen["dataset"]
    assert lf.is_planned(ds)
    assert torch.equal(seen["first"], torch.tensor(ds[:2]["input_ids"]))  # rows 0 and 1: the plan's order
    losses = [x for x in seen["losses"] if x is not None]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_pack_dataset_nothing_fits():
    packed, plan = lf.pack_dataset(dataset_of([64, 70]), 63, neat_packing=True, pad_token_id=0)
    assert len(packed) == 0 and plan.dropped.tolist() == [0, 1]
    assert set(packed.column_names) == {"input_ids", "attention_mask", "position_ids", "labels", "images", "videos",
                                        "audios", "packing_params"}
