"""``packkit analyze``: length statistics, packing simulations over max lengths, a recommended
configuration with its training dynamics, a markdown report and figures, from a dataset file or an
in-memory array of lengths.

    from packkit.analyze import analyze, analyze_lengths
    result = analyze("train.jsonl", "analysis/", length_fields=["num_tokens"], max_lengths="auto,20000")
    result = analyze_lengths(lengths, "analysis/", batch_size=128, epochs=4, dp_size=8)
    result.recommended["max_length"], result.result(20000, "obfd")["efficiency"]

Modules: ``readers`` (file formats), ``lengths`` (fields -> lengths), ``tokenize`` (local tokenizers),
``stats``, ``simulate``, ``recommend``, ``figures``, ``report``, ``outputs`` (atomic writes), ``cli``.
"""
from .api import AnalyzeResult, Options, analyze, analyze_lengths
from .errors import AnalyzeError, MissingDependency
from .lengths import LengthSpec, read_lengths

__all__ = ["analyze", "analyze_lengths", "read_lengths", "AnalyzeResult", "AnalyzeError", "MissingDependency",
           "LengthSpec", "Options"]
