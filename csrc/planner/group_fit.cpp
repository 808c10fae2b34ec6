// Group-aware best fit: bins are formed in groups of dp (one data-parallel step each) while packing,
// instead of grouping finished bins. The second candidate layout of ogbfd (see balance_steps).
#include <algorithm>
#include <limits>

#include "capacity_bitmap.hpp"
#include "dp_layout.hpp"
#include "packers.hpp"

namespace packkit {

namespace {

// With tight_small, items of at most capacity/kSmall tokens go to the fullest bin with room: they
// barely move a bin's cost, and best fit closes gaps (the heavy-first bulk needs the density).
constexpr int64_t kSmall = 64;

// Items longest first, equal lengths in index order (counting sort when the capacity allows), with
// the runs of equal length: order[run_end[r-1] .. run_end[r]) have length run_length[r].
struct Sorted {
  Int32Buffer order;
  std::vector<int64_t> run_end, run_length;
};
Sorted longest_first(const int64_t* lengths, int64_t n, int64_t capacity) {
  Sorted out;
  if (capacity > std::max<int64_t>(int64_t{1} << 22, 8 * n)) {
    out.order = decreasing_order(lengths, n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t len = lengths[out.order[static_cast<size_t>(k)]];
      if (out.run_length.empty() || out.run_length.back() != len) {
        if (!out.run_length.empty()) out.run_end.push_back(k);
        out.run_length.push_back(len);
      }
    }
    if (n > 0) out.run_end.push_back(n);
    return out;
  }
  std::vector<int64_t> first(static_cast<size_t>(capacity) + 2, 0);
  for (int64_t i = 0; i < n; ++i) ++first[static_cast<size_t>(capacity - lengths[i] + 1)];
  for (size_t key = 1; key < first.size(); ++key) first[key] += first[key - 1];
  for (int64_t key = 0; key < capacity; ++key)
    if (first[static_cast<size_t>(key) + 1] > first[static_cast<size_t>(key)]) {
      out.run_end.push_back(first[static_cast<size_t>(key) + 1]);
      out.run_length.push_back(capacity - key);
    }
  out.order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out.order[static_cast<size_t>(first[static_cast<size_t>(capacity - lengths[i])]++)] = static_cast<int32_t>(i);
  return out;
}

}  // namespace

Slots group_best_fit(const int64_t* lengths, int64_t n, const std::vector<double>& costs, int64_t capacity,
                     int64_t dp_size, bool tight_small, const CostModel* length_cost, size_t max_rows,
                     bool* over_rows) {
  if (over_rows) *over_rows = false;
  size_t rows = 0;  // non-empty
  const size_t dp = static_cast<size_t>(dp_size);
  const Sorted sorted = longest_first(lengths, n, capacity);
  const Int32Buffer& order = sorted.order;
  Slots slots;
  std::vector<int64_t> load;
  std::vector<double> cost;
  // Longest items first; each goes to the group whose largest free space fits it most tightly
  // (best fit across steps), and inside that group to the cheapest bin that fits (least cost
  // first, so a step's bins stay level under the cost model). Groups with largest free space f
  // form a stack threaded through next_group; the bitmap holds every f with a non-empty stack.
  const bool dense = capacity <= std::max<int64_t>(int64_t{1} << 22, 8 * n);
  std::vector<int64_t> head(dense ? static_cast<size_t>(capacity) + 1 : 0, -1), next_group;
  CapacityBitmap nonempty(dense ? capacity + 1 : 1);
  std::vector<std::pair<int64_t, int64_t>> sparse;  // (largest free, group) sorted, when not dense
  // Lengths come from the runs and, with a length cost model, costs from the length: no random
  // reads of the per-item arrays in this loop.
  size_t run = 0;
  for (int64_t k = 0; k < n; ++k) {
    while (k >= sorted.run_end[run]) ++run;
    const int64_t item = order[static_cast<size_t>(k)];
    const int64_t len = sorted.run_length[run];
    const double item_cost = length_cost ? (*length_cost)(len) : costs[static_cast<size_t>(item)];
    int64_t g = -1;
    if (dense) {
      const int64_t f = nonempty.find_next(len);
      if (f >= 0) {
        g = head[static_cast<size_t>(f)];
        head[static_cast<size_t>(f)] = next_group[static_cast<size_t>(g)];
        if (head[static_cast<size_t>(f)] < 0) nonempty.clear(f);
      }
    } else {
      auto it = std::lower_bound(sparse.begin(), sparse.end(), std::make_pair(len, int64_t{-1}));
      if (it != sparse.end()) g = it->second, sparse.erase(it);
    }
    if (g < 0) {
      g = static_cast<int64_t>(slots.size() / dp);
      slots.resize(slots.size() + dp);
      for (size_t r = slots.size() - dp; r < slots.size(); ++r) slots[r].reserve(8);  // one allocation per row, mostly
      load.resize(slots.size(), 0);
      cost.resize(slots.size(), 0.0);
      next_group.push_back(-1);
    }
    const size_t lo = static_cast<size_t>(g) * dp;
    size_t best = lo;
    bool have = false;
    const bool by_load = tight_small && len <= capacity / kSmall;
    double best_cost = 0;  // of row `best`, kept out of memory in the scan
    int64_t best_load = 0;
    // The group's two least loads, found in the same pass: its largest free space after the
    // placement follows without a second pass over the group.
    // Sentinels above any load; not capacity + 1, which overflows at capacity = INT64_MAX (UBSan found it).
    int64_t min1 = std::numeric_limits<int64_t>::max(), min2 = min1;
    size_t arg1 = lo;
    for (size_t r = lo; r < lo + dp; ++r) {
      const int64_t lr = load[r];
      if (lr < min1) min2 = min1, min1 = lr, arg1 = r;
      else if (lr < min2) min2 = lr;
      if (capacity - lr < len) continue;
      const double cr = cost[r];
      const bool better = by_load ? lr > best_load : cr < best_cost || (cr == best_cost && lr < best_load);
      if (!have || better) best = r, best_cost = cr, best_load = lr, have = true;
    }
    if (slots[best].empty() && ++rows > max_rows) {
      if (over_rows) *over_rows = true;
      return {};
    }
    slots[best].push_back(item);
    load[best] += len;
    cost[best] += item_cost;
    const int64_t most_free = capacity - (best == arg1 ? std::min(min2, load[best]) : min1);
    if (most_free <= 0) continue;  // full groups are never searched again
    if (dense) {
      next_group[static_cast<size_t>(g)] = head[static_cast<size_t>(most_free)];
      if (head[static_cast<size_t>(most_free)] < 0) nonempty.set(most_free);
      head[static_cast<size_t>(most_free)] = g;
    } else {
      const auto entry = std::make_pair(most_free, g);
      sparse.insert(std::lower_bound(sparse.begin(), sparse.end(), entry), entry);
    }
  }
  return slots;
}

}  // namespace packkit
