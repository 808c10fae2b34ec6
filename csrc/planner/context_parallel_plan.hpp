// Dynamic context parallelism: which ranks run each sequence (its CP group and CP size) and in which order,
// so that the slowest rank finishes first. Pure C++17, no torch.
//
// Execution model: the plan is a list of passes (one forward/backward of a packed row, each sequence in it
// CP-sharded over all of the pass's ranks). Each rank runs the passes naming it in list order; a pass starts
// when all its ranks are free and lasts pass_overhead + sum_j t(j, c) / (slowest speed of its ranks), with
// t(s, c) = cost(s) / c + cp_comm * (c - 1) / c * s for c > 1 and cost(s) at c = 1. Under the "pass" barrier
// every rank runs one pass per step (an empty one if it has nothing) and each step ends with a global barrier.
#pragma once
#include <cstdint>
#include <vector>

namespace packkit {

struct CpOptions {
  int64_t world = 1;
  std::vector<int64_t> caps;   // local tokens per rank and pass, one per rank (> 0)
  std::vector<double> speed;   // relative throughput, one per rank (> 0)
  double cp_comm = 0.0;        // seconds per token of a sequence, times (c - 1) / c
  double pass_overhead = 0.0;  // seconds per pass
  bool pow2 = true;            // groups: aligned power-of-two blocks, else contiguous blocks of any size
  int64_t min_cp = 1, max_cp = 1;
  bool pass_barrier = false;
};

struct CpPlan {
  // Pass p runs on ranks [rank_start[p], rank_start[p] + group_size[p]) the sequences
  // seqs[offsets[p] .. offsets[p + 1]); passes are in execution order.
  std::vector<int64_t> rank_start, group_size, offsets, seqs, step, local_tokens;
  std::vector<double> start, duration;
  std::vector<int64_t> cp_size;  // per input sequence
  double makespan = 0.0, lower_bound = 0.0;
  int64_t num_steps = 0;         // "pass" barrier only
  int64_t candidates = 0;        // plans built and compared
};

// Local tokens per rank of a sequence of `length` tokens on c ranks (zigzag: 2c chunks of equal size).
inline int64_t cp_local_tokens(int64_t length, int64_t c) {
  // ceil(length / 2c) without forming length + 2c - 1 (a length near 2^63 would wrap it).
  return c == 1 ? length : 2 * (length / (2 * c) + (length % (2 * c) != 0));
}

// costs[i] = cost(lengths[i]) at c = 1. Throws InvalidInput for a sequence that fits no allowed group.
CpPlan plan_context_parallel(const int64_t* lengths, const double* costs, int64_t n, const CpOptions& opts);

}  // namespace packkit
