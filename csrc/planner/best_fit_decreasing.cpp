#include <set>
#include <vector>
#include <utility>

#include "packers.hpp"

namespace packkit {

BinAssignment best_fit_decreasing(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items) {
  BinAssignment out;
  std::vector<int64_t> items;  // per bin, only with max_items
  out.order = decreasing_order(lengths, n);
  out.bin_at.resize(static_cast<size_t>(n));
  out.length_at.resize(static_cast<size_t>(n));
  std::set<std::pair<int64_t, int64_t>> open;  // (free space, bin); full bins are left out
  for (size_t k = 0; k < static_cast<size_t>(n); ++k) {
    const int64_t len = lengths[out.order[k]];
    auto it = open.lower_bound({len, -1});  // tightest bin that still fits
    int64_t bin, free_space;
    if (it == open.end()) {
      bin = out.num_bins++;
      free_space = capacity - len;
      if (max_items > 0) items.push_back(0);
    } else {
      bin = it->second;
      free_space = it->first - len;
      open.erase(it);
    }
    const bool room = max_items <= 0 || ++items[static_cast<size_t>(bin)] < max_items;
    if (free_space > 0 && room) open.emplace(free_space, bin);
    out.bin_at[k] = static_cast<int32_t>(bin);
    out.length_at[k] = len;
  }
  return out;
}

}  // namespace packkit
