"""Shared-prefix ("tree") packing: each shared prefix forwarded once, each branch given exactly its context.

A GRPO group (one prompt, G completions), a DPO pair or a multi-turn tree is packed depth first: the prompt,
then its branches. Positions continue from the prefix, so every branch has the positions it would have alone,
and the attention lets a token see its own node causally and its ancestors fully, nothing else.

Layers, in order: ``tree`` / ``radix`` (forests from groups or tokens) -> ``checks`` (the argument rules) ->
``planning`` (trees as plan units, splits) -> ``layout`` (host offsets) -> ``pack`` (one ``packkit::tree_pack``
launch) -> ``attention`` + ``hf`` (transformers registration) -> ``logprobs`` (completion log-probs, DPO / GRPO
losses) -> ``rollouts`` (verl's ``[B, S]`` rollouts). Vision-language prompts (``mrope=``): ``vision`` (prompts,
positions, images in packed order), ``vision_tree`` (``pack_tree``), ``rollouts_vision`` (verl's Qwen-VL rollouts).
"""
from .tree import PrefixForest, groups_forest, sequences_forest
from .radix import build_tree
from .checks import STATUS_ERRORS, check_forest, check_status, status_errors
from .planning import TreePlan, plan_trees, split_oversized, tree_costs, tree_micro_batches
from .pack import SharedPrefixInfo, pack_forest, pack_groups, pack_tree
from .attention_meta import ATTENTION_PATHS, SharedPrefixAttention
from .hf import NAME, register_attention, shared_prefix_attention_forward
from .logprobs import (CompletionLogprobs, completion_logprobs, completion_values, dpo_logps, grpo_token_mean_loss,
                       ppo_token_mean_loss)
from .collator import SharedPrefixCollator, dpo_loss
from .rollouts import RolloutGroupsInfo, check_rollout_groups, pack_rollout_groups, rollout_logprobs
from .vision import VisionReport

__all__ = ["PrefixForest", "build_tree", "groups_forest", "sequences_forest", "TreePlan", "plan_trees", "split_oversized", "tree_costs",
           "tree_micro_batches", "SharedPrefixInfo", "pack_forest", "pack_groups", "pack_tree", "ATTENTION_PATHS",
           "SharedPrefixAttention", "NAME", "register_attention", "shared_prefix_attention_forward",
           "CompletionLogprobs", "completion_logprobs", "completion_values", "dpo_logps", "grpo_token_mean_loss",
           "ppo_token_mean_loss",
           "SharedPrefixCollator", "dpo_loss", "RolloutGroupsInfo", "check_rollout_groups", "pack_rollout_groups",
           "rollout_logprobs", "STATUS_ERRORS", "check_forest", "check_status", "status_errors", "VisionReport"]
