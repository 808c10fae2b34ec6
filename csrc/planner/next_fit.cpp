#include "packers.hpp"

namespace packkit {

BinAssignment next_fit(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items) {
  BinAssignment out;
  out.resize(static_cast<size_t>(n));
  int64_t free_space = 0;  // of the current (last) bin; 0 before the first bin opens
  int64_t items = 0;       // in the current bin
  for (int64_t i = 0; i < n; ++i) {
    if (lengths[i] > free_space || (max_items > 0 && items == max_items)) {
      ++out.num_bins;
      free_space = capacity;
      items = 0;
    }
    free_space -= lengths[i];
    ++items;
    out.order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    out.bin_at[static_cast<size_t>(i)] = static_cast<int32_t>(out.num_bins - 1);
    out.length_at[static_cast<size_t>(i)] = lengths[i];
  }
  return out;
}

}  // namespace packkit
