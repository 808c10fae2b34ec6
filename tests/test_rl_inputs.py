"""Bad input to packkit.rl gets a clear error naming the argument (issue 39: never silently wrong)."""
from __future__ import annotations

import pytest
import torch

from packkit import rl
from test_rl import rollouts


@pytest.mark.parametrize("scale", [2, 0.5])
def test_mask_values_other_than_0_1_are_refused(scale):
    ids, mask = rollouts()
    odd = mask * scale
    with pytest.raises(ValueError, match="other than 0 and 1"):
        rl.rollout_layout(odd)
    with pytest.raises(ValueError, match="other than 0 and 1"):
        rl.pack_rollouts(ids, odd, [0, 1])
    # With a layout of the good mask: flagged on the device, no sync, raised at check_rollouts.
    _, info = rl.pack_rollouts(ids, odd, [0, 1, 3], rl.rollout_layout(mask))
    assert int(info.status) == 3
    with pytest.raises(ValueError, match="other than 0 and 1"):
        rl.check_rollouts(info)


def test_bool_and_float_01_masks_are_rollout_masks():
    ids, mask = rollouts()
    ref, _ = rl.pack_rollouts(ids, mask, [0, 1, 3])
    for m in (mask.bool(), mask.double()):
        got, info = rl.pack_rollouts(ids, m, [0, 1, 3], rl.rollout_layout(m))
        assert torch.equal(got["input_ids"], ref["input_ids"]) and int(info.status) == 0


def test_non_tensor_and_wrong_dtype_inputs():
    ids, mask = rollouts()
    with pytest.raises(TypeError, match="attention_mask must be a \\[batch, seq_len\\] tensor"):
        rl.pack_rollouts(ids, mask.tolist(), [0])
    with pytest.raises(TypeError, match="attention_mask must be a \\[batch, seq_len\\] tensor"):
        rl.rollout_layout(mask[0])
    with pytest.raises(TypeError, match="integer token ids, got dtype torch.float32"):
        rl.pack_rollouts(ids.float(), mask, [0])
    with pytest.raises(TypeError, match="integer token ids"):
        rl.pack_rollouts(ids.bool(), mask, [0])
    with pytest.raises(TypeError, match="equal_count must be True or False"):
        rl.micro_batches([3, 4], 10, 2, equal_count="yes")


def test_negative_token_ids_are_refused():
    ids, mask = rollouts()
    bad = ids.clone()
    bad[3, 7] = -5  # row 3 column 7 is a valid token in rollouts()
    assert mask[3, 7] == 1
    with pytest.raises(ValueError, match="negative token id"):
        rl.pack_rollouts(bad, mask, [1, 3])
    _, info = rl.pack_rollouts(bad, mask, [1, 3], rl.rollout_layout(mask))
    assert int(info.status) == 1
    with pytest.raises(ValueError, match="negative token id"):
        rl.check_rollouts(info)
    # A negative id in padding is never read: not an error.
    pad = ids.clone()
    pad[mask == 0] = -1
    got, _ = rl.pack_rollouts(pad, mask, [1, 3])
    assert (got["input_ids"] >= 0).all()
