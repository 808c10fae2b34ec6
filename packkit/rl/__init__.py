"""RL post-training (PPO/GRPO): rollout micro-batches planned across data-parallel ranks at once, and rollouts
packed on the device with no host sync (``pack_rollouts`` / ``unpack_rollouts``). Stage 3 (training): imports
planning and packing only; the verl drop-in is :mod:`packkit.integrations.verl`."""
from .micro_batches import MicroBatches, micro_batches
from .rollouts import RolloutInfo, RolloutLayout, check_rollouts, pack_rollouts, rollout_layout, unpack_rollouts

__all__ = ["micro_batches", "MicroBatches", "pack_rollouts", "unpack_rollouts", "rollout_layout", "check_rollouts", "RolloutLayout",
           "RolloutInfo"]
