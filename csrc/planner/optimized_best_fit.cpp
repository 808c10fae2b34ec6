#include <algorithm>
#include <climits>
#include <cstdint>

#include "capacity_bitmap.hpp"
#include "packers.hpp"
#include "run_beside.hpp"

namespace packkit {

namespace {
// Dense per-capacity arrays cost ~12 bytes per capacity value; beyond this (and beyond a few
// entries per item) the comparison-based best fit is cheaper. Both give the same bin count.
bool dense_is_cheaper(int64_t capacity, int64_t n) {
  return capacity <= std::max<int64_t>(int64_t{1} << 22, 8 * n);
}
}  // namespace

BinAssignment optimized_best_fit(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items) {
  if (!dense_is_cheaper(capacity, n)) return best_fit_decreasing(lengths, n, capacity, max_items);
  // a bin that reaches max_items is closed like a full one (never pushed back); no limit: never
  const int32_t item_limit = max_items > 0 && max_items < INT32_MAX ? static_cast<int32_t>(max_items) : INT32_MAX;

  BinAssignment out;
  out.order.resize(static_cast<size_t>(n));
  out.bin_at.resize(static_cast<size_t>(n));

  // Counting sort, longest first, equal lengths in index order. Afterwards the items of length
  // `len` occupy order[first[capacity - len] .. first[capacity - len + 1]).
  std::vector<int64_t> first(static_cast<size_t>(capacity) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++first[static_cast<size_t>(capacity - lengths[i] + 1)];
  for (size_t key = 1; key < first.size(); ++key) first[key] += first[key - 1];
  auto scatter = [&] {
    std::vector<int64_t> cursor(first);
    for (int64_t i = 0; i < n; ++i)
      out.order[static_cast<size_t>(cursor[static_cast<size_t>(capacity - lengths[i])]++)] = static_cast<int32_t>(i);
  };
  // Per bin: the next bin of its free-space stack and its item count, side by side (one cache line
  // per placement; the counts spare the emitter a pass over all placements).
  struct BinLink {
    int32_t next, size;
  };
  std::vector<BinLink> link;
  // The placement loop (main) reads only the bucket bounds, never `order`: the scatter runs beside it.
  run_beside(n >= kParallelItems, scatter, [&] {
    // Bins with free space f form a stack threaded through next_bin; head[f] is its top.
    // The bitmap holds every f whose stack is non-empty.
    std::vector<int32_t> head(static_cast<size_t>(capacity) + 1, -1);
    link.reserve(static_cast<size_t>(n / 4 + 16));
    CapacityBitmap nonempty(capacity + 1);

    // Walk the buckets instead of reading lengths[order[k]]: no random reads in the hot loop.
    for (int64_t key = 0; key < capacity; ++key) {
      const int64_t len = capacity - key;
      if (first[static_cast<size_t>(key)] == first[static_cast<size_t>(key) + 1]) continue;
      out.run_end.push_back(first[static_cast<size_t>(key) + 1]);
      out.run_length.push_back(len);
      for (int64_t k = first[static_cast<size_t>(key)]; k < first[static_cast<size_t>(key) + 1]; ++k) {
        const int64_t f = nonempty.find_next(len);
        int32_t bin;
        int64_t new_free;
        if (f < 0) {
          bin = static_cast<int32_t>(out.num_bins++);
          link.push_back({-1, 0});
          new_free = capacity - len;
        } else {
          bin = head[static_cast<size_t>(f)];  // pop
          head[static_cast<size_t>(f)] = link[static_cast<size_t>(bin)].next;
          if (head[static_cast<size_t>(f)] < 0) nonempty.clear(f);
          new_free = f - len;
        }
        if (new_free > 0 && link[static_cast<size_t>(bin)].size + 1 < item_limit) {  // push; full bins are never searched again
          link[static_cast<size_t>(bin)].next = head[static_cast<size_t>(new_free)];
          if (head[static_cast<size_t>(new_free)] < 0) nonempty.set(new_free);
          head[static_cast<size_t>(new_free)] = bin;
        }
        out.bin_at[static_cast<size_t>(k)] = bin;
        ++link[static_cast<size_t>(bin)].size;
      }
    }
  });
  out.bin_size.resize(link.size());
  for (size_t b = 0; b < link.size(); ++b) out.bin_size[b] = link[b].size;
  return out;
}

}  // namespace packkit
