// Lays bins out step-major for data parallelism: slot s*dp_size + r is rank r's row at step s,
// and every step has exactly dp_size slots (the last step is padded with empty bins).
#pragma once
#include <cstddef>
#include <cstdint>

#include "plan_types.hpp"

namespace packkit {

using Slots = std::vector<std::vector<int64_t>>;  // item indices per slot

// Bins in their own order, bin k -> slot k. What every algorithm but ogbfd does with dp_size > 1.
Slots deal_in_order(const BinAssignment& bins, int64_t dp_size);

// ogbfd's grouping. Bins are sorted by cost and consecutive runs of dp_size bins form a step, so
// each step holds bins of similar cost; then, inside each step, items move or swap between bins
// (never past capacity) while that lowers the step's largest bin cost. Empty slots of the last
// step take items from the most loaded bins of other steps when that lowers those steps' maxima.
// Items are only moved, never copied: every item stays in exactly one slot.
// length_cost: the cost model when costs come from lengths alone (nullptr for per-item costs).
// max_items > 0: no slot gets more items than that (bins must be within it: moves keep to it, a candidate built
// while packing that breaks it is not kept).
Slots balance_steps(const BinAssignment& bins, const int64_t* lengths,
                    const std::vector<double>& costs, int64_t capacity, int64_t dp_size,
                    const CostModel* length_cost = nullptr, int64_t max_items = 0);

// ogbfd's first candidate alone: bins sorted by cost, dp_size consecutive bins per step, moves and swaps inside
// each step (balance_steps runs it beside the other two and keeps the best).
Slots sorted_steps(const BinAssignment& bins, const int64_t* lengths, const std::vector<double>& costs,
                   int64_t capacity, int64_t dp_size);

// Group-aware best fit decreasing: longest items first, each into the step (group of dp bins) whose
// largest free space fits it most tightly, and there into the cheapest bin with room (with
// tight_small, items of at most capacity/64 tokens into the fullest bin with room). Step-major.
// length_cost: when costs[i] == (*length_cost)(lengths[i]) for every item (no per-item reads).
// max_rows: gives up (returns empty, *over_rows = true) as soon as more rows than that are non-empty
// (rows only fill up, so the finished layout would have too many; callers that would reject it
// then save the rest of the work).
Slots group_best_fit(const int64_t* lengths, int64_t n, const std::vector<double>& costs, int64_t capacity,
                     int64_t dp_size, bool tight_small = false, const CostModel* length_cost = nullptr,
                     size_t max_rows = SIZE_MAX, bool* over_rows = nullptr);

// The heavy tail first: items longer than capacity/2, sorted, dp per step (at most max_heavy_steps
// such steps; how many were made goes to *heavy_steps_made); each step's leading row takes the
// shortest items and the others fillers up to the leading row's cost; the rest by group_best_fit.
// Empty when it does not apply (too few long items, costs not monotone in length), and empty with
// *over_rows = true once it is sure to have more than max_rows non-empty rows.
Slots heavy_steps_first(const int64_t* lengths, int64_t n, const std::vector<double>& costs, int64_t capacity,
                        int64_t dp_size, size_t max_heavy_steps = SIZE_MAX, size_t* heavy_steps_made = nullptr,
                        size_t max_rows = SIZE_MAX, bool* over_rows = nullptr);

}  // namespace packkit
