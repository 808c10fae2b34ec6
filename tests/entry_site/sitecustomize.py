"""Loaded at interpreter start when tests/entry_site is on PYTHONPATH (tests/test_llamafactory_entry.py): with
``PACKKIT_LF_PROBE`` set, every transformers Trainer gets the test's probe callback (entry_probe_llamafactory), since
``llamafactory-cli train`` has no plugin hook of its own. Nothing happens without the variable."""
import os

if os.environ.get("PACKKIT_LF_PROBE"):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import entry_probe_llamafactory  # noqa: F401  (patches transformers.Trainer.__init__)
