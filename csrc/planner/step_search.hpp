// Local searches for RL micro-batches, lowering sum over steps of the step's costliest micro-batch: across steps
// (step_search.cpp) and inside one step (in_step_search.cpp). Pure C++17 (no torch, no Python); used by
// rl_micro_batches (micro_batches.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace packkit {

// K steps of dp micro-batches, micro-batch m = step * dp + rank. load / tok are kept equal to the sums of costs /
// lengths of items[m] by every change (incremental: nothing is rebuilt per round).
struct StepGrid {
  int64_t dp = 1;
  std::vector<std::vector<int64_t>> items;
  std::vector<double> load;
  std::vector<int64_t> tok;
};

// An item of a step's costliest micro-batch moves (moves = true) or swaps with a cheaper item into a micro-batch of
// *another* step that has room under its step's maximum and under `capacity`: the first step's maximum falls, the
// other's rises by less. Every change strictly lowers the objective (by more than 1e-12 of the total cost), the cap
// holds by construction, swaps keep every micro-batch's item count.
// Sweeps over the steps (largest lead = maximum minus second costliest micro-batch first), each step's best change applied at once, until a sweep finds none or
// after max_rounds changes. The grid's items are 0 .. n-1 and `by_cost` holds each of them once, costliest first
// (ties in a fixed order); each step's items are kept in that order, so swap partners are found per step by a
// binary search and a window bounded by the step's largest slack. A step scanned without result is rescanned only
// against the steps changed since. Deterministic.
// Stops early once the sum of step maxima is <= goal_sum (a goal derived from the certified bound: see
// step_goal; going on to a local optimum would cost many more changes for a gain below the bound's margin).
// Marks changed[s] for every step it changed; returns the number of changes made.
int64_t search_across_steps(StepGrid& grid, const int64_t* lengths, const double* costs, int64_t capacity,
                            const std::vector<int64_t>& by_cost, bool moves, int64_t max_rounds,
                            std::vector<char>& changed, double goal_sum = -1.0);

// Local search inside step s: moves (if allowed) or swaps from its costliest micro-batch to its cheapest ones (up to
// 8 tried) while that lowers the step's maximum and keeps both within `capacity`; at most `rounds` changes.
void search_in_step(StepGrid& grid, size_t s, const int64_t* lengths, const double* costs, int64_t capacity,
                    bool moves, int rounds);

// sum over steps of the costliest micro-batch / sum over steps of the mean (1 when the grid holds no cost).
double step_balance(const StepGrid& grid);

// The certified lower bound on the per-step balance of any layout of these items into K steps of dp micro-batches of
// `capacity` tokens, when every cost is a*l + b*l^2 (a, b >= 0; found from the items, to rel 1e-9): the C++ port of
// packkit/planning/balance_bound.py (same relaxation, same numbers). NaN when the costs are not of that form (a
// callable cost, random costs) or nothing bounds them.
double step_balance_bound(const int64_t* lengths, const double* costs, int64_t n, int64_t capacity, int64_t dp,
                          int64_t K);

}  // namespace packkit
