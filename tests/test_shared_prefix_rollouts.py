"""verl rollouts through ``pack_rollout_groups``: response log-probs in verl's ``[b, R]`` layout equal per-sample
ones (fp64, tiny Llama), each uid's prompt packed once; a uid whose rows differ in their prompt is caught on
the device (``info.status``, no sync) and raised by ``check_rollout_groups``; bad input is refused."""
from __future__ import annotations

import pytest
import torch

from packkit import rl, shared_prefix as sp

from shared_prefix_models import PROMPT, RESPONSE, grpo_rollouts, per_sample_rollouts, tiny

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")


def test_rollout_logprobs_equal_per_sample_and_prompts_are_packed_once():
    model = tiny()
    ids, mask, uids = grpo_rollouts()
    layout = rl.rollout_layout(mask)
    indices = [7, 0, 3, 5, 1, 8]
    batch, info = sp.pack_rollout_groups(ids, mask, uids, indices, layout, prompt_length=PROMPT, attention="varlen")
    assert int(info.status) == 0
    sp.check_rollout_groups(info)
    groups = {uids[i] for i in indices}
    prompt_tokens = sum(int(mask[next(i for i in indices if uids[i] == u), :PROMPT].sum()) for u in groups)
    response_tokens = int(mask[indices, PROMPT:].sum())
    assert batch["input_ids"].shape == (1, prompt_tokens + response_tokens)
    ref = per_sample_rollouts(model, ids[indices], mask[indices])
    model.set_attn_implementation(sp.register_attention())
    logp = sp.rollout_logprobs(model(**batch, use_cache=False).logits, info)
    assert logp.shape == (len(indices), RESPONSE)
    assert float((logp - ref).detach().abs().max()) <= 1e-10 * float(ref.abs().max())


def test_differing_prompts_of_one_uid_are_caught_on_the_device():
    ids, mask, uids = grpo_rollouts()
    same = [i for i in range(len(uids)) if uids[i] == uids[0]]
    bad = ids.clone()
    col = int(torch.nonzero(mask[same[1], :PROMPT]).flatten()[0])
    bad[same[1], col] += 1
    batch, info = sp.pack_rollout_groups(bad, mask, uids, same, prompt_length=PROMPT)
    assert int(info.status) == 1
    with pytest.raises(ValueError, match="prompt tokens that differ"):
        sp.check_rollout_groups(info)


def test_bad_rollout_input_is_refused():
    ids, mask, uids = grpo_rollouts()
    with pytest.raises(ValueError, match="one id per rollout row"):
        sp.pack_rollout_groups(ids, mask, uids[:-1], [0, 1], prompt_length=PROMPT)
    with pytest.raises(ValueError, match="prompt_length"):
        sp.pack_rollout_groups(ids, mask, uids, [0, 1], prompt_length=PROMPT + RESPONSE + 1)
    with pytest.raises(ValueError, match="a row twice"):
        sp.pack_rollout_groups(ids, mask, uids, [0, 0], prompt_length=PROMPT)
    other = mask.clone()  # one uid, two prompt lengths
    same = [i for i in range(len(uids)) if uids[i] == uids[0]]
    first = int(torch.nonzero(other[same[1]]).flatten()[0])
    other[same[1], first] = 0
    with pytest.raises(ValueError, match="share group id"):
        sp.pack_rollout_groups(ids, other, uids, same, prompt_length=PROMPT)
