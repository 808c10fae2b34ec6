"""Loaded at interpreter start when tests/entry_site is on PYTHONPATH (tests/test_llamafactory_entry.py,
tests/test_torchtitan_entry.py): with ``PACKKIT_LF_PROBE`` set, every transformers Trainer gets the test's probe
callback (entry_probe_llamafactory), since ``llamafactory-cli train`` has no plugin hook of its own; with
``PACKKIT_TT_PROBE`` set, torchtitan gets the test's CPU shims (torchtitan_cpu_shims) and its Trainer the probe
(entry_probe_torchtitan). Nothing happens without the variables."""
import os

if os.environ.get("PACKKIT_LF_PROBE"):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import entry_probe_llamafactory  # noqa: F401  (patches transformers.Trainer.__init__)

# tests/test_torchtitan_entry.py: CPU shims, then the probe, in trainer processes only (torchrun sets LOCAL_RANK for
# the ranks it starts, not for itself: its own process has no use for torchtitan's ~5 s of imports).
if os.environ.get("PACKKIT_TT_PROBE") and "LOCAL_RANK" in os.environ:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torchtitan_cpu_shims  # noqa: F401
    import entry_probe_torchtitan  # noqa: F401  (patches torchtitan.trainer.Trainer)
