"""Model support: which model families pack exactly on which path (``packing_support``), and ``prepare_model``,
which installs what a family needs (per-document recurrent kernels and mixers) or refuses it by name.

transformers loads on first use: ``import packkit`` needs only torch and numpy."""
from .prepare import prepare_model, prepare_trainer_model, prepared_path, unprepare_model
from .support import SupportTable, Verdict, packing_support
from .verdicts import PATHS, attention_path

__all__ = ["prepare_model", "prepare_trainer_model", "unprepare_model", "prepared_path", "packing_support", "SupportTable", "Verdict", "PATHS",
           "attention_path"]
