// The planner's entry point: lengths in, a complete plan (CSR segments per bin) out.
#pragma once
#include <functional>

#include "plan_types.hpp"

namespace packkit {

// Per-item costs from item lengths (for user-supplied cost functions); empty = use opts.cost.
using ItemCostFn = std::function<std::vector<double>(const std::vector<int64_t>& item_lengths)>;

// Throws InvalidInput on bad input; never returns a partial plan.
// extra_cost: nullptr, or n finite non-negative costs per source sequence added to the cost of its first
// item (the piece that starts at token 0), e.g. a sample's vision-tower FLOPs.
PlanResult make_plan(const int64_t* lengths, int64_t n, const PlanOptions& opts,
                     const ItemCostFn& item_cost_fn = nullptr, const double* extra_cost = nullptr);

}  // namespace packkit
