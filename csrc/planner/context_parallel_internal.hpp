// Shared between context_parallel_plan.cpp (sizes, bound, candidates) and context_parallel_build.cpp (builders).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "context_parallel_plan.hpp"

namespace packkit {
namespace cp_detail {

// Per-rank arrays the candidate builders share, allocated once per plan: a fresh W-long array per candidate
// (and per step) cost more than the candidate itself on wide worlds (first touch of fresh memory; issue 63:
// 2 sequences on 2^20 ranks). Between builders every array holds its initial value: a builder resets what it
// wrote, over the rank ranges it recorded in `ranges` (so the reset costs what the writes cost).
struct Scratch {
  std::vector<double> free;                      // 0.0
  std::vector<int64_t> last, owner;              // -1
  std::vector<int64_t> next;                     // 0
  std::vector<char> mark;                        // 0
  std::vector<std::vector<double>> level_free;   // 0.0, per pow2 level and aligned block
  std::vector<std::vector<int64_t>> level_used;  // 0
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (first rank, count) written since the last reset
};

// The inputs plus what every candidate plan reuses: the allowed CP sizes and, per size, the largest cap and
// speed a group of that size offers (pow2: per aligned block too, `level_*[log2 c][j]`).
struct Ctx {
  const int64_t* L;
  const double* C;
  int64_t n;
  const CpOptions& opts;
  int64_t W;
  std::vector<int64_t> sizes;           // allowed CP sizes, ascending
  std::vector<int64_t> size_cap;        // per size: max over groups of the group's min cap
  std::vector<double> size_speed;       // per size: max over groups of the group's min speed
  std::vector<std::vector<int64_t>> level_cap;    // pow2: min cap of aligned block j of size 2^l
  std::vector<std::vector<double>> level_speed;   // pow2: min speed of that block
  std::vector<int32_t> min_size;        // per sequence: index of its smallest feasible size
  std::vector<int64_t> by_cost;         // all sequences, costliest first (ties by index): sorted once
  int64_t cap_max = 0;
  double speed_min = 1.0, speed_sum = 1.0;
  bool uniform = true;                  // one cap and one speed for all ranks
  mutable Scratch scratch;              // builders run one at a time

  Ctx(const int64_t* lengths, const double* costs, int64_t n, const CpOptions& opts);
  // The smallest cap and speed of ranks [s, s + c): O(1) on uniform ranks and aligned pow2 blocks (a pass over
  // the whole world would otherwise cost W per candidate), a scan over any-size blocks of mixed ranks.
  std::pair<int64_t, double> group(int64_t s, int64_t c) const;
  double t(int64_t i, int64_t c) const;                    // seconds of sequence i on c ranks at speed 1
  bool fits(int64_t i, size_t k) const;                    // some group of size sizes[k] holds it
  double best_pass_time(int64_t i, size_t k) const;        // alone in a pass on the fastest such group
  double lower_bound(bool barrier_term) const;  // barrier_term: add the "pass" barrier's (certified under it)
  // The "pass" barrier's term of lower_bound: over the 64 costliest sequences (top[0..k_top)).
  double barrier_bound(const std::vector<int64_t>& top, size_t k_top, double work, double rank_passes) const;
  std::vector<int32_t> choose_sizes(double target) const;  // size index per sequence
};

// build_list order 0: widest groups first (then longest), 1: longest pass first whatever its size.
// build_steps order bit 0: the same two sort orders swapped; bit 1: single ranks fill to their cap.
CpPlan build_list(const Ctx& x, const std::vector<int32_t>& chosen, int order);   // no barrier
// off (empty: none): ranks left idle at every step (an empty pass each), so a slow rank need not set every step's
// length; a plan that cannot place some sequence without them has makespan inf.
CpPlan build_steps(const Ctx& x, const std::vector<int32_t>& chosen, int order,
                   const std::vector<char>& off = {});  // "pass" barrier
// A barrier-free plan (build_list) as steps: each pass in the first step after the ones its ranks ran before,
// idle ranks an empty pass; valid under the "pass" barrier, so a candidate there.
CpPlan steps_of_list(const Ctx& x, const CpPlan& list);
// Barrier plans are built without the empty passes of idle ranks (they never set a step's length: every step
// has a pass with sequences, at least as long); this adds them, in step order, to the plan returned.
void add_idle_passes(const Ctx& x, CpPlan& plan);

}  // namespace cp_detail
}  // namespace packkit
