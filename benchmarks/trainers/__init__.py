"""Issue 40's trainer benchmarks: each trainer's own packing vs packkit on the same lengths.

``common`` holds what the three trainer scripts share (workloads, the cost, the dealing of rows to ranks, the
result row and its JSON); ``axolotl.py``, ``swift.py`` and ``llamafactory.py`` each run in their trainer's venv
as scripts; ``benchmarks/bench_trainers.py`` runs them all and prints one table.
"""
