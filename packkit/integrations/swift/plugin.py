"""The file to pass to ``swift sft --external_plugins``: installs packkit's planned packing.

    swift sft ... --packing true --external_plugins "$(python -m packkit.integrations.swift.plugin)"

Options from the environment (:func:`packkit.integrations.swift.patch.options_from_env`): ``PACKKIT_SWIFT_DP_SIZE``
(default: the process group's size), ``PACKKIT_SWIFT_ALGORITHM`` (``obfd`` or ``ogbfd``), ``PACKKIT_SWIFT_COST``
(``attention``, ``tokens`` or ``a,b``; default: the model config's :func:`packkit.transformer_cost`).
It also registers ``packkit_varlen`` with transformers (``--attn_impl packkit_varlen``).
"""
import os

if __name__ == "__main__":
    print(os.path.abspath(__file__))
else:
    from packkit.integrations.swift.patch import install, options_from_env
    from packkit.training.hf_attention import register_varlen_attention

    install(**options_from_env())
    register_varlen_attention()  # so that `--attn_impl packkit_varlen` names an implementation transformers knows
