#include <algorithm>
#include <numeric>

#include "packers.hpp"

namespace packkit {

Int32Buffer decreasing_order(const int64_t* lengths, int64_t n) {
  Int32Buffer order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int32_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lengths[a] > lengths[b]; });
  return order;
}

Int32Buffer decreasing_order(const int64_t* lengths, int64_t n, int64_t max_length) {
  if (max_length > std::max<int64_t>(int64_t{1} << 22, 8 * n)) return decreasing_order(lengths, n);
  std::vector<int64_t> first(static_cast<size_t>(max_length) + 2, 0);  // counting sort, keyed max_length - len
  for (int64_t i = 0; i < n; ++i) ++first[static_cast<size_t>(max_length - lengths[i] + 1)];
  for (size_t key = 1; key < first.size(); ++key) first[key] += first[key - 1];
  Int32Buffer order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    order[static_cast<size_t>(first[static_cast<size_t>(max_length - lengths[i])]++)] = static_cast<int32_t>(i);
  return order;
}

BinAssignment first_fit_decreasing(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items) {
  BinAssignment out;
  out.order = decreasing_order(lengths, n);
  out.bin_at.resize(static_cast<size_t>(n));
  out.length_at.resize(static_cast<size_t>(n));
  if (n == 0) return out;
  // Max segment tree over bins' free space; unopened bins hold 0 and are never chosen, so
  // "leftmost leaf with free >= len" is first fit. There are at most n bins.
  size_t leaves = 1;
  while (leaves < static_cast<size_t>(n)) leaves <<= 1;
  std::vector<int64_t> tree(2 * leaves, 0);
  std::vector<int64_t> items(max_items > 0 ? static_cast<size_t>(n) : 0, 0);  // per bin, only with max_items
  // a bin at max_items holds -1: no item (every length >= 0) is placed there again
  auto closed = [&](size_t bin) { return max_items > 0 && ++items[bin] == max_items; };
  auto update = [&](size_t leaf, int64_t value) {
    size_t node = leaf + leaves;
    tree[node] = value;
    for (node >>= 1; node >= 1; node >>= 1) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
  };
  for (size_t k = 0; k < static_cast<size_t>(n); ++k) {
    const int64_t len = lengths[out.order[k]];
    size_t bin;
    if (tree[1] < len) {
      bin = static_cast<size_t>(out.num_bins++);
      update(bin, closed(bin) ? -1 : capacity - len);
    } else {
      size_t node = 1;
      while (node < leaves) node = tree[2 * node] >= len ? 2 * node : 2 * node + 1;
      bin = node - leaves;
      update(bin, closed(bin) ? -1 : tree[node] - len);
    }
    out.bin_at[k] = static_cast<int32_t>(bin);
    out.length_at[k] = len;
  }
  return out;
}

}  // namespace packkit
