"""The docs pages whose examples import what only the full tier installs (trl, ray, verl, the trainers,
packkit.integrations): run as tests/test_docs_examples.py runs the others."""
from __future__ import annotations

import pytest

from test_docs_examples import FULL_PAGES, ROOT, run_page_test

pytestmark = pytest.mark.full


@pytest.mark.parametrize("page", FULL_PAGES, ids=[str(p.relative_to(ROOT)) for p in FULL_PAGES])
def test_page_examples_run(page, tmp_path):
    run_page_test(page, tmp_path)
