"""Which public callables exist (packkit.__all__, packkit.rl, packkit.shared_prefix, packkit.integrations.*,
the CLI) and the registrations that fuzz them. ``uncovered`` lists what has neither a registration nor a
reason in ``NOT_CALLED`` (tests/test_api_fuzz.py keeps that list empty)."""
from __future__ import annotations

import importlib
import inspect

from . import reg_core, reg_cp_plan, reg_extra, reg_integrations, reg_megatron_cp, reg_more, reg_pipeline, reg_rl_sp

MODULES = ("packkit", "packkit.pipeline", "packkit.rl", "packkit.shared_prefix", "packkit.integrations.megatron",
           "packkit.integrations.verl", "packkit.integrations.verl_shared_prefix", "packkit.integrations.torchtitan",
           "packkit.integrations.axolotl", "packkit.integrations.swift", "packkit.integrations.llamafactory")

# Public names that are not fuzzed by calling them, and why.
NOT_CALLED = {
    "packkit.ContextParallelPlan": "a result type of plan_context_parallel (its passes are checked there)",
    "packkit.pipeline.PipelinePlan": "a result type of plan_pipeline (checked there)",
    "packkit.pipeline.PipelineSim": "a result type of pp_simulate (checked there)",
    "packkit.pipeline.PipelineStep": "a result type of PipelineStepPlanner.step (checked there)",
    "packkit.Segments": "a NamedTuple of plan arrays (its fields are checked by every plan's checker)",
    "packkit.PackLayout": "a NamedTuple returned by pack_layout (checked there)",
    "packkit.PackInfo": "returned by pack_sequences(return_info=True); fuzzed as unpack_sequences' stale info",
    "packkit.PackReport": "a report dataclass returned by pack_dataset(return_report=True)",
    "packkit.PackBuffers": "fuzzed through pack_sequences(out=) in tests/test_buffer_reuse.py; its constructor "
                           "takes the same counts as PackingCollator(num_buffers=)",
    "packkit.register_varlen_attention": "registers a name with transformers (a str argument, checked)",
    "packkit.check_plan": "the raw plan tensors' check (tests/fuzz/ 'ops' target fuzzes it under the sanitizers)",
    "packkit.shared_prefix.register_attention": "registers a name with transformers",
    "packkit.shared_prefix.SharedPrefixAttention": "a torch.nn.Module wrapper used by register_attention",
    "packkit.shared_prefix.SharedPrefixInfo": "metadata returned by pack_groups (fuzzed as stale info)",
    "packkit.shared_prefix.RolloutGroupsInfo": "metadata returned by pack_rollout_groups (fuzzed as stale info)",
    "packkit.shared_prefix.CompletionLogprobs": "a result type",
    "packkit.shared_prefix.PrefixForest": "a result type (hand-made ones: check_forest, fuzzed)",
    "packkit.shared_prefix.TreePlan": "a result type",
    "packkit.shared_prefix.VisionReport": "a result type",
    "packkit.rl.MicroBatches": "a result type (its rank() is fuzzed)",
    "packkit.rl.RolloutLayout": "a result type (fuzzed as a stale layout)",
    "packkit.rl.RolloutInfo": "a result type (fuzzed as stale info)",
    "packkit.PackedRowsCollator": "NOT YET: a padded collator of pack_dataset rows (its checks are "
                                  "PackingCollator's planned_rows path, which is fuzzed)",
    "packkit.mrope_position_ids": "NOT YET: needs a Qwen-VL config and processor-shaped inputs per draw",
    "packkit.shared_prefix.shared_prefix_attention_forward": "NOT YET directly; its numeric arguments go through "
                                                            "attention_args.check_numbers, fuzzed via varlen",
    "packkit.integrations.verl.install": "patches verl (no data argument)",
    "packkit.integrations.verl_shared_prefix.MultiTurnTree": "a result type of multi_turn_tree_batch",
    "packkit.integrations.verl_shared_prefix.multi_turn_tree_batch": "NOT YET: verl-shaped [B, S] masks per draw "
                                                                     "(tests/test_shared_prefix_verl_multiturn.py)",
    "packkit.prepare_model": "NOT YET: needs a model per draw (tests/test_prepare_model.py; its path argument is "
                             "checked by name)",
    "packkit.unprepare_model": "NOT YET: needs a prepared model (tests/test_prepare_model.py)",
    "packkit.packing_support": "NOT YET: needs a config per draw (tests/test_prepare_model.py)",
    "packkit.shared_prefix.ppo_token_mean_loss": "NOT YET: needs pack_tree log-probs and values per draw "
                                                 "(tests/test_shared_prefix_agentic.py)",
    "packkit.integrations.verl_shared_prefix.shared_prefix_log_probs": "NOT YET: needs a model and a verl batch",
    "packkit.integrations.torchtitan.PackkitDataLoader": "NOT YET: needs a torchtitan job config; its stream "
                                                          "(BalancedDocumentStream) is fuzzed",
    "packkit.integrations.torchtitan.torchtitan_cost": "NOT YET: needs a torchtitan model config",
    "packkit.integrations.torchtitan.PackkitTrainer": "torchtitan's Trainer (needs a torchtitan job config); its "
                                                       "check is check_stage_kwargs",
    "packkit.integrations.torchtitan.check_stage_kwargs": "NOT YET: needs torchtitan's VarlenMetadata / BlockMask "
                                                           "per draw (tests/test_torchtitan_pipeline_guard.py); "
                                                           "its cu_seq_q check is check_microbatch's",
    "packkit.integrations.torchtitan.guard_pipeline_stages": "installs hooks on modules (no data argument)",
    "packkit.integrations.megatron.pipeline_data_iterator": "NOT YET: packs with pack_sequences and "
                                                             "packed_seq_params, both fuzzed "
                                                             "(tests/test_megatron_pipeline.py)",
    "packkit.integrations.llamafactory.RowPlan": "a result type of plan_rows (checked there)",
    "packkit.integrations.llamafactory.install": "patches LLaMA-Factory (its arguments are plan_rows' cost / dp_size "
                                                 "/ seed / shuffle, fuzzed there)",
    "packkit.integrations.llamafactory.uninstall": "undoes install (no argument)",
    "packkit.integrations.llamafactory.is_planned": "reads one attribute of a dataset (any object: no bad value)",
    "packkit.integrations.llamafactory.build_rows": "NOT YET: needs LLaMA-Factory's tokenized example columns per "
                                                    "draw (tests/test_llamafactory.py compares it with LLaMA-Factory's "
                                                    "own rows); its plan comes from plan_rows, fuzzed",
    "packkit.integrations.llamafactory.pack_dataset": "NOT YET: a datasets.Dataset of LLaMA-Factory examples mapped "
                                                      "with num_proc (seconds per draw); plans with plan_rows, fuzzed",
    "packkit.integrations.swift.PackedIndex": "a result type of plan_packed_idx (checked there)",
    "packkit.integrations.swift.install": "patches ms-swift (its arguments are plan_packed_idx's, fuzzed there)",
    "packkit.integrations.swift.uninstall": "undoes install (no argument)",
    "packkit.integrations.axolotl.default_dp_size": "reads torch.distributed (no argument)",
    "packkit.integrations.swift.default_dp_size": "reads torch.distributed (no argument)",
}


def public_names() -> list:
    """Dotted names of every public callable/class in MODULES (constants are left out)."""
    out = []
    for modname in MODULES:
        try:
            mod = importlib.import_module(modname)
        except Exception:  # noqa: BLE001 - an integration whose framework is absent here
            continue
        names = getattr(mod, "__all__", None) or [n for n, o in vars(mod).items() if not n.startswith("_")
                                                  and getattr(o, "__module__", None) == modname]
        for n in names:
            try:
                obj = getattr(mod, n, None)
            except ImportError:  # a lazy name whose framework is absent here (axolotl, ms-swift, ...)
                continue
            if obj is None or inspect.ismodule(obj) or not callable(obj):
                continue
            if getattr(obj, "__module__", "") and not str(obj.__module__).startswith("packkit"):
                continue
            out.append(f"{modname}.{n}")
    return sorted(set(out))


# Imported by the parent before it forks: each child would otherwise import them again (seconds each).
PRELOAD = ("megatron.core.packed_seq_params", "verl", "verl.utils.seqlen_balancing", "tensordict",
           "packkit.integrations.swift", "packkit.integrations.llamafactory", "packkit.integrations.axolotl", "torch.nn.attention.flex_attention", "datasets", "transformers",
           "packkit.integrations.torchtitan", "packkit.analyze.cli")


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - absent here: its APIs are not registered either
            pass


# Parameters that take a user callback (a cost callable on an array of lengths): the "callback" class feeds each a
# callable returning complex / NaN / inf / negative / wrong-length / wrong-dtype values (values.callback_draws), which
# must be refused naming the parameter; drawn even where the parameter's other values are skipped.
CALLBACKS = {name: ("cost",) for name in (
    "packkit.plan", "packkit.PackedBatchSampler", "packkit.plan_context_parallel", "packkit.pack_dataset",
    "packkit.rl.micro_batches", "packkit.shared_prefix.pack_groups", "packkit.shared_prefix.pack_tree",
    "packkit.shared_prefix.plan_trees", "packkit.shared_prefix.tree_costs", "packkit.shared_prefix.tree_micro_batches",
    "packkit.integrations.torchtitan.BalancedDocumentStream", "packkit.integrations.verl.balance_batch",
    "packkit.pipeline.plan_pipeline", "packkit.pipeline.PipelineStepPlanner")}


def build() -> dict:
    reg: dict = {}
    for module in (reg_core, reg_rl_sp, reg_more, reg_extra, reg_cp_plan, reg_megatron_cp, reg_integrations,
                   reg_pipeline):
        module.register(reg)
    for name, params in {**CALLBACKS, **reg_integrations.CALLBACK_APIS}.items():
        if name in reg:
            reg[name].callbacks = params
    return reg


def uncovered(reg: dict) -> list:
    covered = {name.split(" ")[0] for name in reg}
    return [n for n in public_names() if n not in covered and n not in NOT_CALLED
            and not any(c.startswith(n + ".") for c in covered)]
