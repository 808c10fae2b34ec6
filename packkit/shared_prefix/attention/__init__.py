"""Attention over a packed prefix forest: a query sees key ``k`` iff ``k <= q < subtree_end[k]`` (its own node
causally, its ancestors fully). ``masks``: the dense reference and FlexAttention; ``two_pass``: FlashAttention
varlen passes merged by log-sum-exp, with an exact backward and no K/V copies."""
