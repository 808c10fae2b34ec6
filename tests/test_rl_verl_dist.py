"""packkit's verl drop-in on 2 gloo ranks (torch.distributed, spawned CPU processes): with a synced count every
rank returns the same number of micro-batches or raises the same ValueError, never one rank alone (its peer would
hang in the next collective); a rank with fewer rows than the agreed count gets empty micro-batches."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("verl.utils.seqlen_balancing")
pytest.importorskip("tensordict")
from dist_helpers import run_gloo_workers  # noqa: E402

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl_dist") / "result.json"
    for _ in range(3):  # the free port can be taken between probing and binding
        codes, logs = run_gloo_workers("verl_dist_worker.py", 2, out, timeout=240)
        if codes == [0, 0] and out.exists():
            break
        if not any("address already in use" in log.lower() or "eaddrinuse" in log.lower() for log in logs):
            break
    assert codes == [0, 0] and out.exists(), "workers failed:\n" + "\n----\n".join(logs)
    return json.loads(out.read_text())


def both(records, name):
    r0, r1 = records[0][name], records[1][name]
    assert r0["after"] == r1["after"] == 2  # both ranks reached the collective after the call
    return r0, r1


def test_synced_never_more_than_verl(records):
    """40 batch pairs (different rows on each rank), both functions synced over the 2 ranks."""
    mine, theirs = records[0]["synced_differential"], records[1]["synced_differential"]
    assert len(mine) == len(theirs) == 40
    compared = 0
    for (ours0, ref0), (ours1, ref1) in zip(mine, theirs):
        assert ours0 == ours1 and ref0 == ref1  # one count per pair, on both ranks
        if ref0 is not None:
            assert ours0 <= ref0
            compared += 1
    assert compared >= 25  # 29: verl raises on the other 11 (a rank with fewer rows than the agreed count)


def test_every_case_gives_both_ranks_the_same_verdict(records):
    assert records[0].keys() == records[1].keys()
    for name in (k for k in records[0] if k != "synced_differential"):
        r0, r1 = both(records, name)
        if "error" in r0 or "error" in r1:
            assert (r0.get("error"), r0.get("message")) == (r1.get("error"), r1.get("message")), name
            assert r0["error"] == "ValueError", name
        else:
            assert r0["count"] == r1["count"], name
            assert r0["equal"] and r1["equal"], name


def test_a_short_rank_gets_empty_micro_batches(records):
    r0, r1 = both(records, "short_rank")
    assert r0["count"] == r1["count"] == 8  # rank 0: 8 rows of 60-95 tokens, no two fit under the 100 cap
    assert r0["rows"] == [1] * 8
    assert sorted(r1["rows"]) == [0] * 5 + [1] * 3 and r1["index_lists"].count([]) == 5
    assert sorted(i for p in r1["index_lists"] for i in p) == [0, 1, 2]


def test_min_num_micro_batch_above_the_rows_on_both_ranks(records):
    r0, r1 = both(records, "min_above_rows")
    assert r0["count"] == r1["count"] == 5
    assert sorted(r0["rows"]) == [0, 0, 1, 1, 1] and sorted(r1["rows"]) == [0, 0, 0, 1, 1]


@pytest.mark.parametrize("name, words", [("no_mask_on_one_rank", "attention_mask"),
                                         ("wide_on_one_rank", "max_token_len=60 and max_seq_len=80"),
                                         ("odd_mask_on_one_rank", "values other than 0 and 1"),
                                         ("indivisible_on_one_rank", "Batch size 3 must be divisible by force_group")])
def test_a_bad_batch_on_one_rank_raises_on_both(records, name, words):
    r0, r1 = both(records, name)
    assert r0["error"] == r1["error"] == "ValueError" and words in r0["message"] and r0["message"] == r1["message"]


def test_verl_uneven_ranks_get_the_largest_bound(records):
    r0, r1 = both(records, "verl_uneven")
    bounds = [-(-sum(r["tokens"]) // 300) for r in (r0, r1)]
    assert r0["count"] == r1["count"] == max(bounds)  # verl's own test: the largest rank's token bound
    assert max(r0["tokens"] + r1["tokens"]) <= 300


@pytest.mark.parametrize("name", ["float_cap", "tensor_cap"])
def test_float_and_tensor_caps_sync(records, name):
    r0, r1 = both(records, name)
    assert r0["count"] == r1["count"] == 4  # rank 1: 7 rows of 50 under 100 -> 4 (rank 0 alone would need 3)
    assert max(r0["tokens"] + r1["tokens"]) <= 100
