"""``llamafactory-cli train config.yaml`` with packkit's plan: ``python -m packkit.integrations.llamafactory.train
config.yaml`` (or ``torchrun --nproc_per_node N -m packkit.integrations.llamafactory.train config.yaml``).

It does what LLaMA-Factory's ``launcher.py`` does (``run_exp()``, which reads the YAML from the command line), after
:func:`~packkit.integrations.llamafactory.install` with the cost of the YAML's model: ``packkit.transformer_cost`` of
``model_name_or_path``'s config (a local folder, or whatever ``AutoConfig`` resolves there), ``"tokens"`` with
``neat_packing`` on eager/sdpa (every row then pays the full 4-D mask's attention). ``PACKKIT_LF_COST`` overrides it
(``tokens``, ``attention`` or ``a,b``).
"""
from __future__ import annotations

import os
import sys


def cost_for(config: dict, environ=None):
    """The cost ``install`` balances under, for a LLaMA-Factory YAML (a dict)."""
    environ = os.environ if environ is None else environ
    override = environ.get("PACKKIT_LF_COST")
    if override:
        if override in ("tokens", "attention"):
            return override
        try:
            a, b = (float(x) for x in override.split(","))
        except ValueError:
            raise ValueError(f"PACKKIT_LF_COST must be 'tokens', 'attention' or 'a,b', got {override!r}") from None
        return (a, b)
    if config.get("neat_packing") and config.get("flash_attn", "auto") in ("sdpa", "disabled", "eager"):
        return "tokens"
    name = config.get("model_name_or_path")
    if not name:
        raise ValueError("the YAML names no model_name_or_path; set PACKKIT_LF_COST to give the cost")
    from transformers import AutoConfig

    from ...planning.cost_model import transformer_cost

    return transformer_cost(AutoConfig.from_pretrained(name, trust_remote_code=bool(config.get("trust_remote_code"))))


def main() -> None:
    if len(sys.argv) < 2 or not sys.argv[1].endswith((".yaml", ".yml", ".json")):
        raise SystemExit("usage: python -m packkit.integrations.llamafactory.train config.yaml [key=value ...]")
    from llamafactory.hparams.parser import read_args

    from . import install

    install(cost=cost_for(read_args()))  # the YAML merged with the key=value overrides, as run_exp reads it
    from llamafactory.train.tuner import run_exp

    run_exp()  # reads sys.argv, as llamafactory-cli train does


if __name__ == "__main__":
    main()
