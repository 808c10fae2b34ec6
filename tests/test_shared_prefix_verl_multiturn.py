"""verl multi-turn rollouts as a shared-prefix tree (``multi_turn_tree_batch``): the log-probs of every generated
token, mapped back to verl's ``[B, response_length]``, equal verl's own padded computation (``logprobs_from_logits``
on the padded batch with ``compute_position_id_with_mask``) times ``response_mask``, fp64 tiny Llama; tool output
and padding are zeros; a mask that scores a tool turn disagrees (the control); bad masks are refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit import shared_prefix as sp
from packkit.integrations.verl_shared_prefix import multi_turn_tree_batch
from shared_prefix_models import VOCAB, fp64_norms, tiny

pytestmark = pytest.mark.full

P, R = 8, 14


def rollouts(seed=0):
    """2 uids x 3 rows: a left-padded prompt per uid, then assistant / tool / assistant turns right-padded; two rows
    of uid 0 share their first assistant turn and tool output (a second tree level)."""
    g = np.random.default_rng(seed)
    ids, am, rm, uids, tool_cols = [], [], [], [], []
    for u in range(2):
        p = int(g.integers(2, P + 1))
        prompt = g.integers(1, VOCAB, p)
        shared = (g.integers(1, VOCAB, 3), g.integers(1, VOCAB, 2))
        for k in range(3):
            a1, tool = shared if (u == 0 and k < 2) else (g.integers(1, VOCAB, int(g.integers(1, 4))),
                                                          g.integers(1, VOCAB, int(g.integers(1, 3))))
            a2 = g.integers(1, VOCAB, int(g.integers(1, 5)))
            resp = np.concatenate([a1, tool, a2])
            mask = np.concatenate([np.ones(len(a1)), np.zeros(len(tool)), np.ones(len(a2))])
            row, att, rmask = np.zeros(P + R, np.int64), np.zeros(P + R, np.int64), np.zeros(R, np.int64)
            row[P - p:P], att[P - p:P] = prompt, 1
            row[P:P + len(resp)], att[P:P + len(resp)], rmask[:len(resp)] = resp, 1, mask
            ids.append(row), am.append(att), rm.append(rmask), uids.append(f"u{u}")
            tool_cols.append(len(a1))  # the first tool column
    return (torch.tensor(np.array(ids)), torch.tensor(np.array(am)), torch.tensor(np.array(rm)),
            np.array(uids, dtype=object), tool_cols)


def verl_padded_logprobs(model, ids, am):
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.torch_functional import logprobs_from_logits

    logits = model(input_ids=ids, attention_mask=am, position_ids=compute_position_id_with_mask(am),
                   use_cache=False).logits
    return logprobs_from_logits(logits[:, -R - 1:-1], ids[:, -R:])


def test_multi_turn_log_probs_equal_verls_padded_computation(monkeypatch):
    pytest.importorskip("verl")
    fp64_norms(monkeypatch)
    model = tiny("llama")
    ids, am, rm, uids, tool_cols = rollouts()
    tree = multi_turn_tree_batch(ids, am, rm, uids)
    assert tree.info.tokens_forwarded < int(am.sum())  # prompts (and a shared turn) forwarded once
    model.set_attn_implementation(sp.register_attention())
    lp = sp.completion_logprobs(model(**tree.batch, use_cache=False).logits, tree.info)
    got = tree.to_verl(lp.padded)
    model.set_attn_implementation("sdpa")
    want = verl_padded_logprobs(model, ids, am)
    torch.testing.assert_close(got, want * rm, rtol=1e-10, atol=1e-12)
    assert (got[rm == 0] == 0).all()
    # Control: counting a tool turn as generated gives a different layout (the check can fail).
    scored_tool = rm.clone()
    scored_tool[0, tool_cols[0]] = 1
    assert not torch.allclose(got, want * scored_tool, rtol=1e-6, atol=1e-8)


def test_bad_multi_turn_batches_are_refused():
    ids, am, rm, uids, _ = rollouts()
    bad = rm.clone()
    bad[0, -1] = 1  # the last response column of row 0 is padding
    with pytest.raises(ValueError, match=r"response_mask\[0, 13\] is 1 on padding"):
        multi_turn_tree_batch(ids, am, bad, uids)
    with pytest.raises(ValueError, match="attention_mask holds a value other than 0 and 1"):
        multi_turn_tree_batch(ids, am * 2, rm, uids)
    with pytest.raises(ValueError, match="uids must hold one id per row"):
        multi_turn_tree_batch(ids, am, rm, uids[:2])
    with pytest.raises(TypeError, match="response_mask must be a"):
        multi_turn_tree_batch(ids, am, rm.numpy(), uids)
    conflict = ids.clone()
    # rows 0 and 1 share tokens; make row 1 score what row 0 treats as tool output
    rm2 = rm.clone()
    rm2[1] = (am[1, P:] == 1).long()
    with pytest.raises(ValueError, match="sequences 0 and 1 share token .* labels differ"):
        multi_turn_tree_batch(conflict, am, rm2, uids)
