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
};

// lengths[i] <= capacity and costs[i] >= 0 (finite) for every item; K >= 1, dp >= 1.
// equal_count: every rank holds the same number of items (n % dp == 0), verl's equal-chunk dispatch.
// Deterministic: items are taken costliest first, ties by length (longer first) then index.
// Algorithm: capped longest-processing-time first into the K*dp micro-batches (each item to the cheapest one
// with room; when the cap fragments the room, the tail goes by first fit, longest first), micro-batches sorted
// by cost and dealt dp consecutive ones per step, then a local search inside each step moving/swapping items
// from the costliest rank to cheaper ones while the cap holds and the step's maximum falls. With equal_count:
// ranks by rounds of dp items (costliest to the cheapest rank), each rank's items into K micro-batches as above,
// step k = every rank's k-th costliest, then swaps only (counts kept).
MicroBatchLayout rl_micro_batches(const int64_t* lengths, const double* costs, int64_t n, int64_t capacity,
                                  int64_t dp, int64_t K, bool equal_count, int refine_rounds = 256);

}  // namespace packkit
