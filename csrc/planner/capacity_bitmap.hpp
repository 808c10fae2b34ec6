// A hierarchical 64-ary bitmap over the integers [0, universe): set, clear and "smallest set
// element >= x" in O(log64 universe) word operations. obfd keys it by remaining bin capacity, so
// best fit is one find_next(item_length) — about 3 word reads for capacities up to 2^18.
#pragma once

#include <cstdint>
#include <vector>

namespace packkit {

class CapacityBitmap {
 public:
  explicit CapacityBitmap(int64_t universe) {
    int64_t words = (universe + 63) / 64;
    do {
      levels_.emplace_back(static_cast<size_t>(words), 0);
      words = (words + 63) / 64;
    } while (levels_.back().size() > 1);
  }

  void set(int64_t x) {
    for (auto& level : levels_) {
      uint64_t& word = level[static_cast<size_t>(x >> 6)];
      const bool was_empty = word == 0;
      word |= uint64_t{1} << (x & 63);
      if (!was_empty) return;  // parents already know this word is non-empty
      x >>= 6;
    }
  }

  void clear(int64_t x) {
    for (auto& level : levels_) {
      uint64_t& word = level[static_cast<size_t>(x >> 6)];
      word &= ~(uint64_t{1} << (x & 63));
      if (word != 0) return;  // word still non-empty: parents unchanged
      x >>= 6;
    }
  }

  // Smallest set element >= x, or -1 if there is none.
  int64_t find_next(int64_t x) const {
    const size_t depth = levels_.size();
    size_t level = 0;
    int64_t i = x;
    // Climb until a word holds a set bit at or after position i.
    for (;;) {
      if (level == depth) return -1;
      const auto& words = levels_[level];
      const size_t w = static_cast<size_t>(i >> 6);
      if (w >= words.size()) return -1;
      const uint64_t masked = words[w] & (~uint64_t{0} << (i & 63));
      if (masked != 0) {
        i = static_cast<int64_t>((w << 6) + __builtin_ctzll(masked));
        break;
      }
      i = static_cast<int64_t>(w) + 1;  // first position of the next word, one level up
      ++level;
    }
    // Descend along the lowest set bits.
    while (level > 0) {
      --level;
      i = (i << 6) + __builtin_ctzll(levels_[level][static_cast<size_t>(i)]);
    }
    return i;
  }

 private:
  std::vector<std::vector<uint64_t>> levels_;  // levels_[0] holds the elements themselves
};

}  // namespace packkit
