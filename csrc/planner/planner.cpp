#include "planner.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "dp_layout.hpp"
#include "hetero_steps.hpp"
#include "overlong.hpp"
#include "packers.hpp"

namespace packkit {

namespace {

std::vector<double> item_costs(const Items& items, const PlanOptions& opts, const ItemCostFn& fn,
                               const double* extra_cost) {
  std::vector<double> costs;
  if (fn) {
    costs = fn(std::vector<int64_t>(items.length, items.length + items.count));
    if (costs.size() != static_cast<size_t>(items.count))
      throw InvalidInput("cost function returned " + std::to_string(costs.size()) + " costs for " +
                         std::to_string(items.count) + " items; it must return one per item");
    for (double c : costs)
      if (!std::isfinite(c) || c < 0) throw InvalidInput("cost function returned a negative or non-finite cost");
  } else {
    costs.resize(static_cast<size_t>(items.count));
    for (size_t i = 0; i < costs.size(); ++i) costs[i] = opts.cost(items.length[i]);
  }
  // A sequence's extra cost (e.g. its images' vision tower) goes with its first piece: split pieces
  // after the first start past token 0; a truncated sequence keeps it.
  if (extra_cost)
    for (int64_t i = 0; i < items.count; ++i)
      if (items.start(i) == 0) costs[static_cast<size_t>(i)] += extra_cost[items.seq(i)];
  return costs;
}

BinAssignment pack_bins(const Items& items, const PlanOptions& opts) {
  switch (opts.algorithm) {
    case Algorithm::NextFit: return next_fit(items.length, items.count, opts.capacity, opts.max_items);
    case Algorithm::FirstFitDecreasing:
      return first_fit_decreasing(items.length, items.count, opts.capacity, opts.max_items);
    case Algorithm::BestFitDecreasing:
      return best_fit_decreasing(items.length, items.count, opts.capacity, opts.max_items);
    case Algorithm::OptimizedBestFit:
    case Algorithm::GroupedBestFit: return optimized_best_fit(items.length, items.count, opts.capacity, opts.max_items);
  }
  throw InvalidInput("unknown algorithm");
}

// Sorts segments [lo, hi) by (seq, start), i.e. by item: input order inside a row. Rows hold few
// segments, so insertion sort on the parallel arrays.
void sort_row(PlanResult& plan, int64_t lo, int64_t hi) {
  auto& seq = plan.seg_seq;
  auto& start = plan.seg_start;
  auto& len = plan.seg_length;
  if (start.empty()) {  // whole sequences: the index alone orders them
    for (int64_t a = lo + 1; a < hi; ++a) {
      const int64_t q = seq[a], l = len[a];
      int64_t b = a;
      for (; b > lo && seq[b - 1] > q; --b) seq[b] = seq[b - 1], len[b] = len[b - 1];
      seq[b] = q, len[b] = l;
    }
    return;
  }
  for (int64_t a = lo + 1; a < hi; ++a) {
    const int64_t q = seq[a], s = start[a], l = len[a];
    int64_t b = a;
    for (; b > lo && (seq[b - 1] > q || (seq[b - 1] == q && start[b - 1] > s)); --b) {
      seq[b] = seq[b - 1];
      start[b] = start[b - 1];
      len[b] = len[b - 1];
    }
    seq[b] = q, start[b] = s, len[b] = l;
  }
}

// One row per bin (dp_size == 1): a counting sort of placements by bin (counts from the packer when
// it kept them), then rows in input order. Bin costs come from the placement-ordered lengths.
void emit_bins(PlanResult& plan, const Items& items, const BinAssignment& bins, const PlanOptions& opts,
               const std::vector<double>* custom_costs) {
  const size_t n = bins.order.size();
  const size_t num_bins = static_cast<size_t>(bins.num_bins);
  plan.bin_offsets.assign(num_bins + 1, 0);
  plan.rank_costs.assign(num_bins, 0.0);
  auto item_cost = [&](size_t k, int64_t len) {
    return custom_costs ? (*custom_costs)[static_cast<size_t>(bins.order[k])] : opts.cost(len);
  };
  const bool counted = bins.bin_size.size() == num_bins;
  if (counted) {
    for (size_t b = 0; b < num_bins; ++b) plan.bin_offsets[b + 1] = bins.bin_size[b];
  } else {
    bins.for_each_length([&](size_t k, int64_t) { ++plan.bin_offsets[static_cast<size_t>(bins.bin_at[k]) + 1]; });
  }
  for (size_t b = 1; b < plan.bin_offsets.size(); ++b) plan.bin_offsets[b] += plan.bin_offsets[b - 1];

  plan.seg_seq.resize(n);
  plan.seg_length.resize(n);
  const bool starts = !items.identity || opts.fill_identity_starts;
  if (starts) plan.seg_start.resize(n);
  // Write cursor and cost of each bin side by side: one random cache line per placement.
  struct Cursor {
    int64_t at;
    double cost;
  };
  std::vector<Cursor> cursor(num_bins);
  for (size_t b = 0; b < num_bins; ++b) cursor[b] = {plan.bin_offsets[b], 0.0};
  if (items.identity && opts.capacity <= INT32_MAX) {
    // Whole sequences: scatter one 8-byte key (index << 32 | length) per placement instead of two
    // values, sort each row's keys, then split them in one sequential pass. Half the random writes;
    // the key buffer is seg_seq's own.
    uint64_t* key = reinterpret_cast<uint64_t*>(plan.seg_seq.data());
    bins.for_each_length([&](size_t k, int64_t len) {
      Cursor& c = cursor[static_cast<size_t>(bins.bin_at[k])];
      c.cost += item_cost(k, len);
      key[c.at++] = static_cast<uint64_t>(bins.order[k]) << 32 | static_cast<uint64_t>(len);
    });
    for (size_t b = 0; b < num_bins; ++b) {
      plan.rank_costs[b] = cursor[b].cost;
      const int64_t lo = plan.bin_offsets[b], hi = plan.bin_offsets[b + 1];
      for (int64_t a = lo + 1; a < hi; ++a) {  // insertion sort: rows hold few segments
        const uint64_t v = key[a];
        int64_t j = a;
        for (; j > lo && key[j - 1] > v; --j) key[j] = key[j - 1];
        key[j] = v;
      }
      for (int64_t a = lo; a < hi; ++a) {
        const uint64_t v = key[a];
        plan.seg_length[static_cast<size_t>(a)] = static_cast<int64_t>(v & 0xffffffffu);
        plan.seg_seq[static_cast<size_t>(a)] = static_cast<int64_t>(v >> 32);
      }
    }
    if (starts) std::fill(plan.seg_start.begin(), plan.seg_start.end(), 0);
    return;
  }
  bins.for_each_length([&](size_t k, int64_t len) {
    const int64_t item = bins.order[k];
    Cursor& c = cursor[static_cast<size_t>(bins.bin_at[k])];
    const size_t at = static_cast<size_t>(c.at++);
    c.cost += item_cost(k, len);
    plan.seg_seq[at] = items.seq(item);
    plan.seg_length[at] = len;
    if (!items.identity) plan.seg_start[at] = items.start(item);
  });
  for (size_t b = 0; b < num_bins; ++b) plan.rank_costs[b] = cursor[b].cost;
  if (items.identity && starts) std::fill(plan.seg_start.begin(), plan.seg_start.end(), 0);  // sequential, not scattered
  for (size_t b = 0; b + 1 < plan.bin_offsets.size(); ++b)
    sort_row(plan, plan.bin_offsets[b], plan.bin_offsets[b + 1]);
}

// Rows from explicit slots (dp layouts), input order inside each row.
void emit_slots(PlanResult& plan, const Items& items, Slots& slots, const std::vector<double>& costs) {
  plan.bin_offsets.reserve(slots.size() + 1);
  plan.seg_seq.reserve(static_cast<size_t>(items.count));
  plan.seg_start.reserve(static_cast<size_t>(items.count));
  plan.seg_length.reserve(static_cast<size_t>(items.count));
  plan.bin_offsets.push_back(0);
  plan.rank_costs.assign(slots.size(), 0.0);
  for (size_t b = 0; b < slots.size(); ++b) {
    auto& slot = slots[b];
    std::sort(slot.begin(), slot.end());
    for (int64_t item : slot) {
      plan.seg_seq.push_back(items.seq(item));
      plan.seg_start.push_back(items.start(item));
      plan.seg_length.push_back(items.length[item]);
      plan.rank_costs[b] += costs[static_cast<size_t>(item)];
    }
    plan.bin_offsets.push_back(static_cast<int64_t>(plan.seg_seq.size()));
  }
}

// rank_costs is per row, step-major: [num_steps, dp_size].
void finish_steps(PlanResult& plan, int64_t dp_size) {
  const int64_t num_bins = plan.num_bins();
  plan.num_steps = num_bins / dp_size;
  for (int64_t b = 0; b < num_bins; ++b)
    if (plan.bin_offsets[static_cast<size_t>(b)] == plan.bin_offsets[static_cast<size_t>(b) + 1]) ++plan.empty_bins;
}

// Per-rank capacities and speeds (the Python layer validates them first; this keeps the core safe on its own).
void check_ranks(const PlanOptions& opts) {
  if (opts.rank_capacity.empty()) return;
  if (opts.algorithm != Algorithm::GroupedBestFit)
    throw InvalidInput("per-rank capacities and speeds are planned by ogbfd only");
  if (static_cast<int64_t>(opts.rank_capacity.size()) != opts.dp_size ||
      static_cast<int64_t>(opts.rank_speed.size()) != opts.dp_size)
    throw InvalidInput("rank_capacity and rank_speed must have dp_size entries");
  int64_t most = 0;
  for (size_t r = 0; r < opts.rank_capacity.size(); ++r) {
    if (opts.rank_capacity[r] <= 0) throw InvalidInput("every rank capacity must be > 0");
    if (!(std::isfinite(opts.rank_speed[r]) && opts.rank_speed[r] > 0))
      throw InvalidInput("every rank speed must be finite and > 0");
    most = std::max(most, opts.rank_capacity[r]);
  }
  if (most != opts.capacity) throw InvalidInput("capacity must be the largest rank capacity");
}

}  // namespace

PlanResult make_plan(const int64_t* lengths, int64_t n, const PlanOptions& opts, const ItemCostFn& item_cost_fn,
                     const double* extra_cost) {
  // The bound keeps round_up(num_bins, dp_size) from overflowing (a fuzzer found dp_size = 2^63 - 1) and
  // the up to dp_size - 1 empty padding rows of the last step to a size that can be allocated.
  constexpr int64_t kMaxDpSize = int64_t{1} << 24;
  if (opts.dp_size < 1 || opts.dp_size > kMaxDpSize)
    throw InvalidInput("dp_size must be in [1, " + std::to_string(kMaxDpSize) + "], got " +
                       std::to_string(opts.dp_size));
  if (!(std::isfinite(opts.cost.a) && std::isfinite(opts.cost.b) && opts.cost.a >= 0 && opts.cost.b >= 0 &&
        opts.cost.a + opts.cost.b > 0))
    throw InvalidInput("cost coefficients (a, b) must be finite, >= 0 and not both 0");
  if (extra_cost)
    for (int64_t i = 0; i < n; ++i)
      if (!(std::isfinite(extra_cost[i]) && extra_cost[i] >= 0))
        throw InvalidInput("extra_cost[" + std::to_string(i) + "] is " + std::to_string(extra_cost[i]) +
                           "; every extra cost must be finite and >= 0");

  check_ranks(opts);
  if (opts.max_items < 0) throw InvalidInput("max_sequences must be >= 1 (or unset), got " + std::to_string(opts.max_items));
  // the heterogeneous step layout fills rows of different capacities: it does not count items per row
  if (opts.max_items > 0 && !opts.rank_capacity.empty())
    throw InvalidInput("max_sequences is not planned with per-rank capacities or rank_speed (ogbfd's heterogeneous "
                       "step layout does not take it): plan with one capacity");
  PlanResult plan;
  plan.dp_size = opts.dp_size;
  const Items items = make_items(lengths, n, opts.capacity, opts.overlong, plan.report);
  plan.kept_tokens = items.total;
  if (plan.kept_tokens < 0) {
    plan.kept_tokens = 0;
    for (int64_t i = 0; i < items.count; ++i)  // fuzz finding: the sum overflowed (UB) for lengths near 2^63
      if (__builtin_add_overflow(plan.kept_tokens, items.length[i], &plan.kept_tokens))
        throw InvalidInput("the kept lengths sum to more than 2^63 - 1 tokens; plan in chunks");
  }

  const bool per_item = item_cost_fn || extra_cost;  // costs no function of length alone
  if (!opts.rank_capacity.empty()) {
    const std::vector<double> costs = item_costs(items, opts, item_cost_fn, extra_cost);
    Slots slots = hetero_steps(items.length, items.count, costs, opts.rank_capacity, opts.rank_speed);
    emit_slots(plan, items, slots, costs);
    finish_steps(plan, opts.dp_size);
    return plan;
  }
  const BinAssignment bins = pack_bins(items, opts);
  if (opts.dp_size == 1) {  // ogbfd with one rank is obfd
    const std::vector<double> custom =
        per_item ? item_costs(items, opts, item_cost_fn, extra_cost) : std::vector<double>{};
    emit_bins(plan, items, bins, opts, per_item ? &custom : nullptr);
  } else {
    const std::vector<double> costs = item_costs(items, opts, item_cost_fn, extra_cost);
    Slots slots = opts.algorithm == Algorithm::GroupedBestFit
                      ? balance_steps(bins, items.length, costs, opts.capacity, opts.dp_size,
                                      per_item ? nullptr : &opts.cost, opts.max_items)
                      : deal_in_order(bins, opts.dp_size);
    emit_slots(plan, items, slots, costs);
  }

  finish_steps(plan, opts.dp_size);
  return plan;
}

}  // namespace packkit
