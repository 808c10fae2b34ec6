// Group-aware best fit: bins are formed in groups of dp (one data-parallel step each) while packing,
// instead of grouping finished bins. The second candidate layout of ogbfd (see balance_steps).
#include <algorithm>
#include <set>
#include <utility>

#include "dp_layout.hpp"
#include "packers.hpp"

namespace packkit {

Slots group_best_fit(const int64_t* lengths, int64_t n, const std::vector<double>& costs, int64_t capacity,
                     int64_t dp_size) {
  const size_t dp = static_cast<size_t>(dp_size);
  const Int32Buffer order = decreasing_order(lengths, n);
  Slots slots;
  std::vector<int64_t> load;
  std::vector<double> cost;
  // (largest free space among a group's bins, group): longest items first, each goes to the group
  // whose largest free space fits it most tightly (best fit across steps), and inside that group to
  // the cheapest bin that fits (least cost first, so a step's bins stay level under the cost model).
  std::set<std::pair<int64_t, size_t>> open;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t item = order[static_cast<size_t>(k)];
    const int64_t len = lengths[item];
    auto it = open.lower_bound({len, size_t{0}});
    size_t g;
    if (it == open.end()) {
      g = slots.size() / dp;
      slots.resize(slots.size() + dp);
      load.resize(slots.size(), 0);
      cost.resize(slots.size(), 0.0);
    } else {
      g = it->second;
      open.erase(it);
    }
    size_t best = g * dp;
    bool have = false;
    for (size_t r = g * dp; r < (g + 1) * dp; ++r) {
      if (capacity - load[r] < len) continue;
      if (!have || cost[r] < cost[best] || (cost[r] == cost[best] && load[r] < load[best])) best = r, have = true;
    }
    slots[best].push_back(item);
    load[best] += len;
    cost[best] += costs[static_cast<size_t>(item)];
    int64_t most_free = 0;
    for (size_t r = g * dp; r < (g + 1) * dp; ++r) most_free = std::max(most_free, capacity - load[r]);
    if (most_free > 0) open.emplace(most_free, g);
  }
  return slots;
}

}  // namespace packkit
