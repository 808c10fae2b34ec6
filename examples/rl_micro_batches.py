"""verl-style RL micro-batching with packkit: plan one global batch of rollouts across data-parallel ranks, pack each
micro-batch on the rollouts' device with no host sync, run a tiny random Llama on it and bring the per-token
log-probs back to verl's [B, S] layout. Runs on CPU in a few seconds (the same code runs on a GPU)."""
import torch
import transformers

from packkit import rl

torch.manual_seed(0)
B, PROMPT, RESPONSE, DP, CAP = 16, 12, 20, 2, 96
device = "cuda" if torch.cuda.is_available() else "cpu"

# verl's rollout tensors: left-padded prompt + right-padded response in each row.
prompt_len = torch.randint(2, PROMPT + 1, (B,))
response_len = torch.randint(1, RESPONSE + 1, (B,))
cols = torch.arange(PROMPT + RESPONSE)
attention_mask = ((cols >= PROMPT - prompt_len[:, None]) & (cols < PROMPT + response_len[:, None])).long().to(device)
input_ids = torch.randint(1, 100, (B, PROMPT + RESPONSE), device=device) * attention_mask

layout = rl.rollout_layout(attention_mask)  # the one device-to-host copy of this global batch
plan = rl.micro_batches(layout.length, CAP, dp_size=DP, cost=lambda x: 24576 * x + x ** 2)  # verl's workload
print(plan)

config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, use_cache=False)
model = transformers.LlamaForCausalLM(config).to(device).eval()

rank = 0  # what rank 0 runs; every rank runs plan.num_micro_batches micro-batches in lock step
log_probs = torch.zeros(B, RESPONSE, device=device)
for indices in plan.indices[rank]:
    batch, info = rl.pack_rollouts(input_ids, attention_mask, indices, layout)  # no host sync
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
    next_ids = torch.roll(batch["input_ids"][0], -1)
    token_logp = torch.log_softmax(logits.float(), -1).gather(1, next_ids[:, None])[:, 0]
    full = rl.unpack_rollouts(token_logp, info)  # [len(indices), S], rows in `indices` order, 0 at padding
    log_probs[torch.as_tensor(indices, device=device)] = full[:, -RESPONSE - 1:-1]  # verl's response slice
    print(f"micro-batch of {len(indices)} rollouts, {batch['input_ids'].shape[1]} tokens (cap {CAP})")

mine = torch.cat([torch.as_tensor(i) for i in plan.indices[rank]])
response_mask = attention_mask[mine.to(device), PROMPT:] != 0
print("rank 0 response log-probs:", tuple(log_probs[mine.to(device)].shape),
      "mean", float(log_probs[mine.to(device)][response_mask].mean()))
