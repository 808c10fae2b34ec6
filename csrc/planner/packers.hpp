// Single-row bin packers: each assigns items (given by length) to bins of `capacity`.
// Every item length must be in [1, capacity]; the over-long policy has run before.
// Bins are numbered in opening order. max_items > 0: no bin takes more than that many items (a bin that reaches
// it is closed like a full one: static-shape batches with a fixed number of sequence slots per row); 0: no limit.
#pragma once
#include "plan_types.hpp"

namespace packkit {

// Next fit: items in input order, a new bin whenever the current one cannot take the item.
BinAssignment next_fit(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items = 0);

// First fit decreasing: longest first (ties by index), each into the lowest-numbered bin it fits.
BinAssignment first_fit_decreasing(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items = 0);

// Best fit decreasing, the textbook way: comparison sort + ordered set of (free space, bin).
BinAssignment best_fit_decreasing(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items = 0);

// Optimized best fit decreasing: counting sort + CapacityBitmap over free space with a stack of
// bins per free-space value. Same bin count as best_fit_decreasing, O(n + capacity) time.
BinAssignment optimized_best_fit(const int64_t* lengths, int64_t n, int64_t capacity, int64_t max_items = 0);

// Indices 0..n-1 ordered by length descending, equal lengths by index ascending.
Int32Buffer decreasing_order(const int64_t* lengths, int64_t n);
// The same order by counting sort when every length is in [0, max_length] and max_length is small against n.
Int32Buffer decreasing_order(const int64_t* lengths, int64_t n, int64_t max_length);

}  // namespace packkit
