// Plain data types shared by every planner stage. No torch, no Python: C++17 only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace packkit {

// Large planner buffers are touched once, in full: on Linux they are 2 MiB aligned and marked for
// transparent huge pages, which cuts the page faults of a 10M-item plan (hundreds of MB of fresh
// memory) about 500-fold. Smaller ones come from operator new as usual.
inline void* allocate_large(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
#if defined(__linux__)
  if (bytes >= 2 * kHuge) {
    const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, rounded);
    if (!p) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure just means small pages
    return p;
  }
#endif
  return ::operator new(bytes);
}
inline void free_large(void* p, size_t bytes) {
#if defined(__linux__)
  if (bytes >= 2 * (size_t{2} << 20)) {
    std::free(p);
    return;
  }
#endif
  ::operator delete(p);
}

// std::allocator that leaves ints uninitialised on resize: large scratch and output arrays are
// written in full anyway, and zeroing them first costs a whole extra pass.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(allocate_large(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { free_large(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Int64Buffer = std::vector<int64_t, DefaultInitAllocator<int64_t>>;
using Int32Buffer = std::vector<int32_t, DefaultInitAllocator<int32_t>>;

// Items per plan are indexed with int32 (half the memory traffic of int64); lengths and token
// totals stay int64.
constexpr int64_t kMaxItems = INT32_MAX;

enum class Algorithm { NextFit, FirstFitDecreasing, BestFitDecreasing, OptimizedBestFit, GroupedBestFit };
enum class OverlongPolicy { Error, Drop, Truncate, Split };

Algorithm parse_algorithm(const std::string& name);       // "nf", "ffd", "bfd", "obfd", "ogbfd"
OverlongPolicy parse_overlong(const std::string& name);   // "error", "drop", "truncate", "split"

// Bad user input. Bindings turn it into a Python ValueError.
struct InvalidInput : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Packable items: item i is the piece [start(i), start(i) + length[i]) of source sequence seq(i).
// When no length is zero or over-long, items are the sequences themselves (`identity`) and
// nothing is copied: `length` points at the caller's array. The "split" policy makes several items
// per sequence; items are ordered by (seq, start) either way.
struct Items {
  const int64_t* length = nullptr;
  int64_t count = 0;
  bool identity = true;
  int64_t total = -1;  // sum of the item lengths if make_items knew it and it fits int64, else -1
  std::vector<int64_t> seq_storage, start_storage, length_storage;  // used when !identity

  int64_t seq(int64_t i) const { return identity ? i : seq_storage[static_cast<size_t>(i)]; }
  int64_t start(int64_t i) const { return identity ? 0 : start_storage[static_cast<size_t>(i)]; }
  Items() = default;
  Items(Items&&) = default;  // vector moves keep their buffers, so `length` stays valid
  Items(const Items&) = delete;
};

// What the over-long policy (and zero-length handling) did, as sorted source indices.
struct PolicyReport {
  std::vector<int64_t> dropped, truncated, split, zero_length;
};

// Items assigned to bins, in the order the packer placed them: order[k] went into bin bin_at[k]
// and has length length_at[k] (kept so later passes read sequentially, not at random).
// Packers that place items in runs of equal length (obfd) store the runs instead of length_at:
// placements [run_end[r-1], run_end[r]) have length run_length[r] (saves 8 bytes per item).
// Bins are numbered 0..num_bins-1 in opening order.
struct BinAssignment {
  Int32Buffer order, bin_at;
  Int64Buffer length_at;
  std::vector<int64_t> run_end, run_length;
  std::vector<int32_t> bin_size;  // items per bin, when the packer counted them (obfd); else empty
  int64_t num_bins = 0;
  void resize(size_t n) {
    order.resize(n);
    bin_at.resize(n);
    length_at.resize(n);
  }
  // Calls f(k, length) for every placement k in order.
  template <class F>
  void for_each_length(F&& f) const {
    if (run_end.empty()) {
      for (size_t k = 0; k < order.size(); ++k) f(k, length_at[k]);
      return;
    }
    size_t k = 0;
    for (size_t r = 0; r < run_end.size(); ++r)
      for (const size_t end = static_cast<size_t>(run_end[r]); k < end; ++k) f(k, run_length[r]);
  }
};

// Cost of an item for data-parallel balance: a * length + b * length^2.
struct CostModel {
  double a = 1.0, b = 0.0;
  double operator()(int64_t len) const {
    const double l = static_cast<double>(len);
    return a * l + b * l * l;
  }
};

struct PlanOptions {
  int64_t capacity = 0;
  Algorithm algorithm = Algorithm::OptimizedBestFit;
  OverlongPolicy overlong = OverlongPolicy::Error;
  int64_t dp_size = 1;
  CostModel cost;
  // false: when every item is a whole sequence, leave PlanResult::seg_start empty (all starts are
  // 0) for a caller that supplies lazily zeroed memory instead of 8 written bytes per item.
  bool fill_identity_starts = true;
  // Heterogeneous ranks (ogbfd only; empty = every rank has `capacity` and speed 1): rank i's rows hold at most
  // rank_capacity[i] tokens (capacity is then their maximum) and run at relative speed rank_speed[i].
  std::vector<int64_t> rank_capacity;
  std::vector<double> rank_speed;
  // > 0: no row holds more than this many items (every algorithm; not with rank_capacity); 0: no limit.
  int64_t max_items = 0;
};

// The finished plan in CSR form: bin b holds segments [bin_offsets[b], bin_offsets[b+1]).
// Bins are rows in row order; with dp_size > 1 they are step-major (bin s*dp_size + r -> rank r, step s).
struct PlanResult {
  Int64Buffer seg_seq, seg_start, seg_length;
  std::vector<int64_t> bin_offsets;
  PolicyReport report;
  int64_t dp_size = 1, num_steps = 0, empty_bins = 0;
  int64_t kept_tokens = 0;
  std::vector<double> rank_costs;  // num_steps * dp_size, step-major
  int64_t num_bins() const { return static_cast<int64_t>(bin_offsets.size()) - 1; }
};

}  // namespace packkit
