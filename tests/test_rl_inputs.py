"""Bad input to packkit.rl gets a clear error naming the argument (issue 39: never silently wrong)."""
from __future__ import annotations

import pytest
import torch

from packkit import rl
from test_rl import rollouts

pytestmark = pytest.mark.core


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


def test_unpack_rollouts_arguments():
    ids, mask = rollouts()
    batch, info = rl.pack_rollouts(ids, mask, [0, 1, 3])
    t = batch["input_ids"].shape[1]
    with pytest.raises(TypeError, match="values must be a tensor"):
        rl.unpack_rollouts([0.0] * t, info)
    with pytest.raises(TypeError, match="info must be the RolloutInfo"):
        rl.unpack_rollouts(torch.zeros(t), {"layout": None})
    with pytest.raises(TypeError, match="fill must be a real number"):
        rl.unpack_rollouts(torch.zeros(t), info, fill="x")
    with pytest.raises(ValueError, match="fill=0.5 cannot be held by these torch.int64"):
        rl.unpack_rollouts(torch.zeros(t, dtype=torch.int64), info, fill=0.5)
    with pytest.raises(ValueError, match="not a bool value"):
        rl.unpack_rollouts(torch.zeros(t, dtype=torch.bool), info, fill=2)
    out = rl.unpack_rollouts(torch.ones(t, dtype=torch.int64), info, fill=-7)
    assert out.dtype == torch.int64 and set(out.unique().tolist()) == {-7, 1}


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(position_ids_start=-5), ValueError, "position_ids_start must be an int >= 0"),
    (dict(position_ids_start=1.5), ValueError, "position_ids_start must be an int >= 0"),
    (dict(check="no"), TypeError, "check must be True or False"),
])
def test_pack_rollouts_options(kwargs, error, match):
    ids, mask = rollouts()
    with pytest.raises(error, match=match):
        rl.pack_rollouts(ids, mask, [0, 1], rl.rollout_layout(mask), **kwargs)


def test_micro_batches_rank_and_token_total():
    mb = rl.micro_batches([3, 4, 5], 10, 2)
    assert [len(b) for b in mb.rank(1)] == [len(b) for b in mb.indices[1]]
    for r in (2, -1, 1.0, True):
        with pytest.raises(ValueError, match="rank must be an int in \\[0, 2\\)"):
            mb.rank(r)
    # int64 would wrap the total to a negative number and report a bound of 0 micro-batches.
    with pytest.raises(ValueError, match="more than 2\\^63 - 1"):
        rl.micro_batches([2**62, 2**62], 2**63 - 1, 2)
