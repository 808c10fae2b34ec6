#include "overlong.hpp"

#include <algorithm>
#include <string>

namespace packkit {

Algorithm parse_algorithm(const std::string& name) {
  if (name == "nf") return Algorithm::NextFit;
  if (name == "ffd") return Algorithm::FirstFitDecreasing;
  if (name == "bfd") return Algorithm::BestFitDecreasing;
  if (name == "obfd") return Algorithm::OptimizedBestFit;
  if (name == "ogbfd") return Algorithm::GroupedBestFit;
  throw InvalidInput("unknown algorithm '" + name + "'; allowed: nf, ffd, bfd, obfd, ogbfd");
}

OverlongPolicy parse_overlong(const std::string& name) {
  if (name == "error") return OverlongPolicy::Error;
  if (name == "drop") return OverlongPolicy::Drop;
  if (name == "truncate") return OverlongPolicy::Truncate;
  if (name == "split") return OverlongPolicy::Split;
  throw InvalidInput("unknown overlong policy '" + name + "'; allowed: error, drop, truncate, split");
}

Items make_items(const int64_t* lengths, int64_t n, int64_t capacity, OverlongPolicy policy,
                 PolicyReport& report) {
  if (capacity <= 0) throw InvalidInput("capacity must be > 0, got " + std::to_string(capacity));
  if (n < 0) throw InvalidInput("number of lengths must be >= 0");

  // The common case in one branch-free pass: every length in [1, capacity], so the
  // sequences are the items. The sum wraps harmlessly in uint64; it is exact when max * n fits.
  {
    int64_t lo = INT64_MAX, hi = 0;
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, lengths[i]);
      hi = std::max(hi, lengths[i]);
      sum += static_cast<uint64_t>(lengths[i]);
    }
    if (n == 0 || (lo >= 1 && hi <= capacity)) {
      Items items;
      items.length = lengths;
      items.count = n;
      if (n == 0 || hi <= INT64_MAX / n) items.total = static_cast<int64_t>(sum);  // else planner sums, checked
      return items;
    }
  }

  // Otherwise one validation pass first, so an error never leaves a half-made result behind.
  int64_t negatives = 0, first_negative = -1, overlong = 0, first_overlong = -1, extra_pieces = 0, zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lengths[i];
    zeros += len == 0;
    if (len < 0) {
      if (negatives++ == 0) first_negative = i;
    } else if (len > capacity) {
      if (overlong++ == 0) first_overlong = i;
      // Pieces beyond the first under "split"; saturated, since it is only compared with kMaxItems and
      // lengths near 2^63 with a small capacity would overflow the sum.
      extra_pieces = std::min(extra_pieces + std::min((len - 1) / capacity, kMaxItems + 1), kMaxItems + 1);
    }
  }
  if (negatives > 0)
    throw InvalidInput(std::to_string(negatives) + " lengths are negative (first at index " +
                       std::to_string(first_negative) + ": " + std::to_string(lengths[first_negative]) +
                       "); lengths must be >= 0");
  if (overlong > 0 && policy == OverlongPolicy::Error)
    throw InvalidInput(std::to_string(overlong) + " sequences are longer than capacity " +
                       std::to_string(capacity) + " (first at index " + std::to_string(first_overlong) +
                       ", length " + std::to_string(lengths[first_overlong]) +
                       "); pass overlong='drop', 'truncate' or 'split' to handle them");

  const int64_t items_needed = n + (policy == OverlongPolicy::Split ? extra_pieces : 0);
  if (items_needed > kMaxItems)
    throw InvalidInput("a plan holds at most " + std::to_string(kMaxItems) + " items (sequences or split pieces), got " +
                       std::to_string(items_needed) + "; plan in chunks");
  Items items;

  items.identity = false;
  const size_t reserve = static_cast<size_t>(n + (policy == OverlongPolicy::Split ? extra_pieces : 0));
  items.seq_storage.reserve(reserve);
  items.start_storage.reserve(reserve);
  items.length_storage.reserve(reserve);
  auto push = [&](int64_t seq, int64_t start, int64_t len) {
    items.seq_storage.push_back(seq);
    items.start_storage.push_back(start);
    items.length_storage.push_back(len);
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lengths[i];
    if (len == 0) {
      report.zero_length.push_back(i);
    } else if (len <= capacity) {
      push(i, 0, len);
    } else if (policy == OverlongPolicy::Drop) {
      report.dropped.push_back(i);
    } else if (policy == OverlongPolicy::Truncate) {
      report.truncated.push_back(i);
      push(i, 0, capacity);  // keeps the first `capacity` tokens
    } else {  // Split: consecutive pieces, each a separate item
      report.split.push_back(i);
      // Fuzz finding: `start += capacity` past the last piece overflowed for len > 2^63 - capacity (UB;
      // in practice an endless loop of pieces until out of memory). Stop at the last piece instead.
      for (int64_t start = 0;; start += capacity) {
        push(i, start, std::min(capacity, len - start));
        if (len - start <= capacity) break;
      }
    }
  }
  items.length = items.length_storage.data();
  items.count = static_cast<int64_t>(items.length_storage.size());
  return items;
}

}  // namespace packkit
