"""The file to pass to ``swift sft --external_plugins``: installs packkit's planned packing with its defaults.

    swift sft ... --packing true --external_plugins "$(python -m packkit.integrations.swift.plugin)"

Options from the environment: ``PACKKIT_SWIFT_DP_SIZE`` (default: the process group's size),
``PACKKIT_SWIFT_ALGORITHM`` (``obfd`` or ``ogbfd``), ``PACKKIT_SWIFT_COST`` (``attention``, ``tokens`` or ``a,b``;
default: the model config's :func:`packkit.transformer_cost`).
"""
import os


def _options() -> dict:
    dp_size = os.environ.get("PACKKIT_SWIFT_DP_SIZE")
    cost = os.environ.get("PACKKIT_SWIFT_COST")
    if cost and "," in cost:
        try:
            cost = tuple(float(x) for x in cost.split(","))
        except ValueError:
            raise ValueError(f"PACKKIT_SWIFT_COST must be 'attention', 'tokens' or 'a,b' numbers, got {cost!r}") from None
    if dp_size is not None:
        if not dp_size.strip().isdigit():
            raise ValueError(f"PACKKIT_SWIFT_DP_SIZE must be a positive integer, got {dp_size!r}")
        dp_size = int(dp_size)
    return {"dp_size": dp_size, "cost": cost or None, "algorithm": os.environ.get("PACKKIT_SWIFT_ALGORITHM") or None}


if __name__ == "__main__":
    print(os.path.abspath(__file__))
else:
    from packkit.integrations.swift import install

    install(**_options())
