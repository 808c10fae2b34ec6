"""Stage 5, tools: the ``packkit`` command line and its demo (``packkit analyze`` lives in :mod:`packkit.analyze`)."""
