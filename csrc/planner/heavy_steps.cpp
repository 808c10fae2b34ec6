// ogbfd's third candidate layout: the heavy tail planned first. Items longer than capacity/2 never
// share a row; sorted, dp consecutive ones form a step. A step's costliest row is then bounded below
// by its longest item's cost, so instead of filling every row to the brim with the longest items
// that fit (which raises the leading row too), the leading row takes the shortest items and every
// other row takes fillers whose cost brings it up to (not above) the leading row. Everything else
// is packed by group_best_fit (short items best fit, to keep the rows as few as best fit's + dp). Costs must grow with length (true for a*len + b*len^2).
#include <algorithm>

#include "capacity_bitmap.hpp"
#include "dp_layout.hpp"

namespace packkit {

namespace {

// Items by length with "longest item of length <= x" and removal, each O(log64 capacity).
class Pool {
 public:
  Pool(const int64_t* lengths, const std::vector<int32_t>& items, int64_t capacity)
      : lengths_(lengths), capacity_(capacity), head_(static_cast<size_t>(capacity) + 1, -1),
        next_(static_cast<size_t>(*std::max_element(items.begin(), items.end())) + 1, -1), keys_(capacity + 1) {
    for (auto it = items.rbegin(); it != items.rend(); ++it) add(*it);  // index order within a length
  }
  bool empty() const { return keys_.find_next(0) < 0; }
  // Longest item with length <= x, or -1.
  int64_t longest_up_to(int64_t x) const {
    if (x <= 0) return -1;
    const int64_t key = keys_.find_next(capacity_ - std::min(x, capacity_));
    return key < 0 ? -1 : head_[static_cast<size_t>(key)];
  }
  // Shortest item, or -1. Items are only removed, so the shortest length only grows.
  int64_t shortest() {
    for (; shortest_len_ <= capacity_; ++shortest_len_)
      if (head_[static_cast<size_t>(capacity_ - shortest_len_)] >= 0)
        return head_[static_cast<size_t>(capacity_ - shortest_len_)];
    return -1;
  }
  void remove_head_of(int64_t item) {
    const size_t key = static_cast<size_t>(capacity_ - lengths_[item]);
    head_[key] = next_[static_cast<size_t>(item)];
    if (head_[key] < 0) keys_.clear(static_cast<int64_t>(key));
  }
  std::vector<int32_t> rest() const {
    std::vector<int32_t> out;
    for (size_t key = 0; key < head_.size(); ++key)
      for (int64_t i = head_[key]; i >= 0; i = next_[static_cast<size_t>(i)]) out.push_back(static_cast<int32_t>(i));
    return out;
  }

 private:
  void add(int64_t item) {
    const size_t key = static_cast<size_t>(capacity_ - lengths_[item]);
    next_[static_cast<size_t>(item)] = head_[key];
    if (head_[key] < 0) keys_.set(static_cast<int64_t>(key));
    head_[key] = item;
  }
  const int64_t* lengths_;
  int64_t capacity_, shortest_len_ = 1;
  std::vector<int64_t> head_, next_;
  CapacityBitmap keys_;
};

}  // namespace

Slots heavy_steps_first(const int64_t* lengths, int64_t n, const std::vector<double>& costs, int64_t capacity,
                        int64_t dp_size, size_t max_heavy_steps, size_t* heavy_steps_made, size_t max_rows,
                        bool* over_rows) {
  if (over_rows) *over_rows = false;
  const size_t dp = static_cast<size_t>(dp_size);
  if (capacity > std::max<int64_t>(int64_t{1} << 22, 8 * n)) return {};  // per-length tables too large
  // Costs must not fall as length grows: the filler search walks lengths down to lower the cost.
  std::vector<double> lo(static_cast<size_t>(capacity) + 1, -1), hi(static_cast<size_t>(capacity) + 1, -1);
  for (int64_t i = 0; i < n; ++i) {
    const size_t l = static_cast<size_t>(lengths[i]);
    const double c = costs[static_cast<size_t>(i)];
    lo[l] = lo[l] < 0 ? c : std::min(lo[l], c);
    hi[l] = std::max(hi[l], c);
  }
  double below = 0;
  // Lengths present, ascending, with their least cost: non-decreasing once the check below passes.
  std::vector<int64_t> present;
  std::vector<double> present_lo;
  for (size_t l = 1; l < lo.size(); ++l) {
    if (lo[l] < 0) continue;
    if (lo[l] < below) return {};
    below = hi[l];
    present.push_back(static_cast<int64_t>(l));
    present_lo.push_back(lo[l]);
  }
  // Longest length l whose cheapest item still fits the budget (base + lo[l] <= level), or 0. Every
  // item longer than that costs more than the budget (costs grow with length), so the filler
  // search can start there instead of walking down one length at a time.
  auto longest_affordable = [&](double base, double level) -> int64_t {
    const auto it = std::partition_point(present_lo.begin(), present_lo.end(),
                                         [&](double c) { return base + c <= level; });
    return it == present_lo.begin() ? 0 : present[static_cast<size_t>(it - present_lo.begin()) - 1];
  };
  std::vector<int32_t> big, other;
  for (int64_t i = 0; i < n; ++i) (2 * lengths[i] > capacity ? big : other).push_back(static_cast<int32_t>(i));
  std::stable_sort(big.begin(), big.end(), [&](int32_t x, int32_t y) { return lengths[x] > lengths[y]; });
  // Full heavy steps (at most max_heavy_steps); the remaining big items go to the bulk.
  const size_t heavy = std::min(big.size() / dp, max_heavy_steps);
  if (heavy == 0 || other.empty()) return {};
  if (heavy_steps_made) *heavy_steps_made = heavy;
  if (heavy * dp > max_rows) {  // every heavy row holds a long item
    if (over_rows) *over_rows = true;
    return {};
  }
  // other is in index order; sort the big items appended to it and merge (not a full sort).
  const auto appended = static_cast<std::ptrdiff_t>(other.size());
  for (size_t k = heavy * dp; k < big.size(); ++k) other.push_back(big[k]);
  std::sort(other.begin() + appended, other.end());
  std::inplace_merge(other.begin(), other.begin() + appended, other.end());
  Pool pool(lengths, other, capacity);

  Slots slots(heavy * dp);
  auto close_gap = [&](size_t row, int64_t& load, double& cost) {
    for (int64_t i = pool.longest_up_to(capacity - load); i >= 0; i = pool.longest_up_to(capacity - load)) {
      pool.remove_head_of(i);
      slots[row].push_back(i);
      load += lengths[i];
      cost += costs[static_cast<size_t>(i)];
    }
  };
  for (size_t s = 0; s < heavy; ++s) {
    std::vector<int64_t> load(dp);
    std::vector<double> cost(dp);
    for (size_t r = 0; r < dp; ++r) {
      const int32_t item = big[s * dp + r];
      slots[s * dp + r].push_back(item);
      load[r] = lengths[item];
      cost[r] = costs[static_cast<size_t>(item)];
    }
    // The leading row (r = 0, the longest item): shortest items while they fit.
    for (int64_t i = pool.shortest(); i >= 0 && lengths[i] <= capacity - load[0]; i = pool.shortest()) {
      pool.remove_head_of(i);
      slots[s * dp].push_back(i);
      load[0] += lengths[i];
      cost[0] += costs[static_cast<size_t>(i)];
    }
    close_gap(s * dp, load[0], cost[0]);
    const double level = cost[0];
    // Other rows: longest fillers that fit and keep the row at or below the leading row's cost.
    for (size_t r = 1; r < dp; ++r) {
      int64_t room = capacity - load[r];
      while (room > 0) {
        int64_t i = pool.longest_up_to(std::min(room, longest_affordable(cost[r], level)));
        while (i >= 0 && cost[r] + costs[static_cast<size_t>(i)] > level) i = pool.longest_up_to(lengths[i] - 1);
        if (i < 0) break;
        pool.remove_head_of(i);
        slots[s * dp + r].push_back(i);
        load[r] += lengths[i];
        cost[r] += costs[static_cast<size_t>(i)];
        room = capacity - load[r];
      }
      // Rows must stay full, or the bulk needs more rows: top up with the shortest items, then
      // close the last gap with the longest item that fits.
      for (int64_t i = pool.shortest(); i >= 0 && lengths[i] <= capacity - load[r]; i = pool.shortest()) {
        pool.remove_head_of(i);
        slots[s * dp + r].push_back(i);
        load[r] += lengths[i];
        cost[r] += costs[static_cast<size_t>(i)];
      }
      close_gap(s * dp + r, load[r], cost[r]);
    }
  }
  // The bulk: the rest of the items, grouped while packing, renumbered back to item indices.
  const std::vector<int32_t> rest = pool.rest();
  std::vector<int64_t> rest_lengths(rest.size());
  std::vector<double> rest_costs(rest.size());
  for (size_t k = 0; k < rest.size(); ++k) {
    rest_lengths[k] = lengths[rest[k]];
    rest_costs[k] = costs[static_cast<size_t>(rest[k])];
  }
  Slots bulk = group_best_fit(rest_lengths.data(), static_cast<int64_t>(rest.size()), rest_costs, capacity, dp_size,
                              /*tight_small=*/true, nullptr, max_rows - heavy * dp, over_rows);
  if (over_rows && *over_rows) return {};
  for (auto& row : bulk) {
    for (auto& k : row) k = rest[static_cast<size_t>(k)];
    slots.push_back(std::move(row));
  }
  return slots;
}

}  // namespace packkit
