"""examples/shared_prefix_grpo.py runs (subprocess, CPU): shared log-probs equal the completion alone (fp32), fewer
tokens are forwarded than unshared, and GRPO raises the high-advantage completions' log-probs."""
from __future__ import annotations

import re

import pytest

from test_examples import _needs, run_example

pytestmark = pytest.mark.full


@_needs("transformers")
def test_shared_prefix_grpo_example():
    out = run_example("shared_prefix_grpo.py")
    forwarded, unshared = map(int, re.search(r"(\d+) tokens forwarded .* \(unshared: (\d+)\)", out).groups())
    assert forwarded < unshared / 2
    assert float(re.search(r"difference: ([0-9.e+-]+)", out).group(1)) < 1e-4
    means = [float(m) for m in re.findall(r"high-advantage completions (-?[0-9.]+)", out)]
    assert len(means) == 6 and means[-1] > means[0]
