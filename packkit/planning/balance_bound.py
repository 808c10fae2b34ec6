"""A certified lower bound on the per-step imbalance any data-parallel plan of given items can reach.

``Plan.balance`` is ``sum_s max_r R[s, r] / sum_s mean_r R[s, r]`` for row costs ``R`` over ``S`` steps
of ``dp`` rows. The denominator is ``T / dp`` for every plan (``T`` = total cost), so a lower bound on
``sum_s max_r R[s, r]`` over all plans with at most ``S`` steps bounds the balance. Cost per item is
``c(l) = a*l + b*l**2`` with ``a, b >= 0``: convex with ``c(0) = 0``, hence superadditive
(``c(x) + c(y) <= c(x + y)``).

The bound is the optimum of a relaxation every real plan satisfies. Sort all ``N = S*dp`` row costs
decreasingly, ``R_(1) >= ... >= R_(N)`` (a plan with fewer steps gets empty rows of cost 0):

1. **Grouping.** However rows are grouped into steps of ``dp``, ``sum_s max_r >= sum_k R_(k*dp+1)``:
   the ``(k-1)*dp + 1`` costliest rows span at least ``k`` steps, so the k-th largest step maximum is
   ``>= R_((k-1)*dp+1)``. Call ``l_k = R_(k*dp+1)`` (k = 0..S-1) the group leaders.
2. **Big items.** Items longer than ``capacity / 2`` never share a row. With ``L_1 >= L_2 >= ...``
   their lengths, the rows holding the j longest are j distinct rows of cost ``>= c(L_j)``, so
   ``R_(j) >= c(L_j)`` and ``l_k >= c(L_(k*dp+1))``.
3. **Row caps.** A row holding big item ``L`` has its other items within ``capacity - L`` tokens, so
   its cost is ``<= c(L) + c(capacity - L)`` (superadditivity); a row without a big item holds items
   no longer than ``s`` (the longest non-big item) and costs at most ``q*c(s) + c(capacity - q*s)``,
   ``q = capacity // s`` (a convex sum over ``{0 <= l_i <= s, sum l_i <= capacity}`` peaks at a
   vertex). Sorting preserves per-row caps: ``R_(j) <= U_(j)``, the j-th largest cap.
4. **Total.** ``sum_j R_(j) = T`` and ``R_(j) <= l_k`` for j in group k (sorted order).

So ``T <= sum_k sum_{j in group k} min(l_k, U_(j))``. Minimising ``sum_k l_k`` subject to that and to
``l_k >= c(L_(k*dp+1))`` (the order constraint between leaders is dropped: a further relaxation) is a
concave capacity covered at unit price: raise leaders where the slope ``#{j in group k: U_(j) > l_k}``
is steepest first (greedy is exact for concave piecewise-linear capacities). The result divided by
``T / dp`` is the bound. On the seed-001-like lognormal (capacity 20000, dp 8, attention) it is 1.00078:
the longest items force the first steps' maxima while their rows cannot hold enough filler to match.
"""
from __future__ import annotations

import numpy as np


def step_balance_lower_bound(item_lengths, capacity: int, dp_size: int, num_steps: int, a: float,
                             b: float) -> float:
    """Lower bound on ``Plan.balance`` for any plan of these items (each ``1 <= len <= capacity``)
    into at most ``num_steps`` steps of ``dp_size`` rows of ``capacity`` tokens, under cost
    ``a*len + b*len**2``. Returns 1.0 when there is nothing to balance. See the module docstring."""
    lengths = np.asarray(item_lengths, dtype=np.float64)
    lengths = lengths[lengths > 0]
    if a < 0 or b < 0 or a + b <= 0:
        raise ValueError(f"cost coefficients must be >= 0 and not both 0, got ({a}, {b})")
    if len(lengths) and lengths.max() > capacity:
        raise ValueError("item lengths must be <= capacity")
    cost = lambda x: a * x + b * x * x  # noqa: E731
    total = float(cost(lengths).sum())
    if total <= 0 or num_steps <= 0 or dp_size <= 1:
        return 1.0
    rows = num_steps * dp_size
    big = np.sort(lengths[lengths * 2 > capacity])[::-1]
    small = lengths[lengths * 2 <= capacity]
    if len(big) > rows:
        raise ValueError(f"{len(big)} items longer than capacity/2 cannot fit in {rows} rows")
    if len(small):
        s = float(small.max())
        q = capacity // s
        small_cap = q * cost(s) + cost(capacity - q * s)
    else:
        small_cap = 0.0
    caps = np.sort(np.concatenate([cost(big) + cost(capacity - big), np.full(rows - len(big), small_cap)]))[::-1]
    groups = caps.reshape(num_steps, dp_size)  # each row descending
    leaders = np.zeros(num_steps)
    firsts = np.arange(0, len(big), dp_size)
    leaders[:len(firsts)] = cost(big[firsts])
    if not len(big):
        leaders[0] = float(cost(lengths.max()))  # the costliest item is in some row
    covered = float(np.minimum(groups, leaders[:, None]).sum())
    bound = float(leaders.sum())
    need = total - covered
    if need > 0:
        # Segments of each group's concave capacity above its leader: row j (descending) adds slope
        # j + 1 between max(leader, next row's cap) and its own cap.
        below = np.concatenate([groups[:, 1:], np.full((num_steps, 1), -np.inf)], axis=1)
        widths = (groups - np.maximum(below, leaders[:, None])).clip(min=0).ravel()
        slopes = np.tile(np.arange(1, dp_size + 1, dtype=np.float64), num_steps)
        order = np.argsort(-slopes, kind="stable")
        widths, slopes = widths[order], slopes[order]
        gains = np.cumsum(widths * slopes)
        full = int(np.searchsorted(gains, need))  # segments taken whole before the last one
        if full < len(gains):
            bound += float(widths[:full].sum()) + (need - (gains[full - 1] if full else 0.0)) / slopes[full]
            need = 0.0
        if need > 1e-9 * total:  # cannot happen for items that fit in num_steps steps
            raise ValueError("the items do not fit in num_steps steps")
    # Float rounding could lift the bound above an exactly balanced plan: step back a hair.
    return max(1.0, bound / (total / dp_size) * (1 - 1e-12))
