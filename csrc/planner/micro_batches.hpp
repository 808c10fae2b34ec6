// RL micro-batches: one global batch of rollouts -> K token-capped micro-batches on each of dp ranks.
// Pure C++17 (no torch, no Python); bound as packkit._planner.rl_micro_batches.
#pragma once
#include <cstdint>
#include <vector>

namespace packkit {

struct MicroBatchLayout {
  bool feasible = false;          // false: some item fit in no micro-batch at this K (try K + 1)
  std::vector<int64_t> order;     // item indices grouped by micro-batch (rank-major: rank * K + step), ascending
  std::vector<int64_t> offsets;   // dp * K + 1 offsets into order
  std::vector<int64_t> tokens;    // dp * K tokens per micro-batch (rank-major)
  std::vector<double> costs;      // dp * K cost per micro-batch (rank-major)
  int64_t num_micro_batches = 0;  // K, or K + 1 (try_next)
  double bound = 0;               // certified lower bound on the balance at this K (NaN: unknown or not asked)
  double goal = 1;                // the balance where the cross-step search stops
};

// lengths[i] <= capacity and costs[i] >= 0 (finite) for every item; K >= 1, dp >= 1.
// equal_count: every rank holds the same number of items (n % dp == 0), verl's equal-chunk dispatch.
// Deterministic: items are taken costliest first, ties by length (longer first) then index (a radix sort).
// Algorithm: longest processing time first into the K*dp micro-batches, each item to the micro-batch with room that
// holds the least cost + tokens (both relative to their mean per micro-batch, found in O(log) on a segment tree),
// so every micro-batch gets a similar mix of long and short items; if the cap fragments the room so an item fits
// nowhere, retried with the last 1/8, 1/4, 1/2, 3/4, all items placed longest first by first fit. Micro-batches
// are then sorted by cost and dealt dp consecutive ones per step, and a local search inside each step moves/swaps
// items from the costliest rank to the cheapest ranks (up to 8 tried) while the cap holds and the step's maximum
// falls. With equal_count: ranks by rounds of dp items (costliest to the cheapest rank), each rank's items into K
// micro-batches as above, step k = every rank's k-th costliest, then swaps only (counts kept).
// Then, if the per-step balance is still above search_above, the cross-step search (step_search.hpp: moves/swaps
// from a step's costliest micro-batch into micro-batches of other steps, at most search_rounds changes in all),
// each pass followed (without equal_count) by dealing the micro-batches into steps again by cost and by the in-step
// search on the steps that changed; it ends on a cross-step pass that finds no improving change (or the budget).
// search_rounds = 0: no cross-step search. Every step of it lowers sum over steps of the costliest micro-batch.
// goal_margin >= 0: where every cost is a*l + b*l^2 (a, b >= 0), the search's goal is max(search_above, certified
// bound at K + goal_margin), but at most search_above + goal_margin where bound + goal_margin / 2 is within that,
// instead of search_above: it runs only while the balance is above the goal and stops as
// soon as it reaches it (not at a local optimum). bound / goal are reported.
// try_next: K + 1 micro-batches per rank are laid out too; the layout with the lower balance before the search is
// searched first, the other only if the first misses its goal; the better result is returned (num_micro_batches).
// Not feasible only if neither K nor K + 1 is.
// O(n log(K*dp)) plus the bounded local searches.
MicroBatchLayout rl_micro_batches(const int64_t* lengths, const double* costs, int64_t n, int64_t capacity,
                                  int64_t dp, int64_t K, bool equal_count, int refine_rounds = 256,
                                  int64_t search_rounds = 0, double search_above = 1.0, double goal_margin = -1.0,
                                  bool try_next = false);

}  // namespace packkit
