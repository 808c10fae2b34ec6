"""GRPO with shared-prefix packing: each prompt is forwarded once, followed by its G completions, and the
per-token completion log-probs are exactly what each completion gets alone. A few on-policy GRPO steps on a tiny
random Llama (CPU, a few seconds; the same code runs on a GPU): the mean log-prob of the high-advantage
completions rises, and the tokens forwarded drop by the shared prompts."""
import torch
import transformers

from packkit import shared_prefix as sp

torch.manual_seed(0)
GROUPS, G, PROMPT, COMPLETION, CAPACITY = 4, 8, 48, 12, 512
device = "cuda" if torch.cuda.is_available() else "cpu"

prompts = [torch.randint(1, 100, (PROMPT,)).tolist() for _ in range(GROUPS)]
completions = [[torch.randint(1, 100, (int(torch.randint(1, COMPLETION + 1, (1,))),)).tolist() for _ in range(G)]
               for _ in range(GROUPS)]
rewards = torch.randn(GROUPS, G)
advantages = ((rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)).flatten().to(device)

config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, use_cache=False)
model = transformers.LlamaForCausalLM(config).to(device)
model.set_attn_implementation(sp.register_attention())
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

batch, info = sp.pack_groups(prompts, completions, capacity=CAPACITY, device=device)
print(f"{info.tokens_forwarded} tokens forwarded in {info.layout.num_rows} rows of {CAPACITY} "
      f"(unshared: {info.tokens_unshared})")

# The check the tests make in fp64, here in fp32: one completion alone gives the same log-probs.
with torch.no_grad():
    shared = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
    model.set_attn_implementation("sdpa")
    alone = torch.tensor([prompts[1] + completions[1][3]], device=device)
    logp = torch.log_softmax(model(input_ids=alone).logits[0, :-1].float(), -1).gather(1, alone[0, 1:, None])[:, 0]
    model.set_attn_implementation(sp.register_attention())
    n = len(completions[1][3])
    print(f"max |shared - alone| log-prob difference: {float((shared.per_sequence[G + 3] - logp[-n:]).abs().max()):.1e}")

good = advantages > 0
for step in range(6):
    logprobs = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
    loss = sp.grpo_token_mean_loss(logprobs, advantages)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    mean_good = float(logprobs.padded[good][logprobs.mask[good]].mean())
    print(f"step {step}: loss {float(loss):+.4f}, mean log-prob of high-advantage completions {mean_good:.4f}")
