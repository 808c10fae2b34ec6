// Pipeline parallelism (issue 61): the op orders of torch.distributed.pipelining's schedules, an event simulator
// of one pipeline step under them, a certified lower bound on any order's step time, and the pipeline-aware plan
// (which documents share a micro-batch row, which DP rank runs it, in which order). Pure C++17, no torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace packkit {
namespace pipeline {

enum class Schedule { GPipe, OneFOneB, Interleaved, ZeroBubble };
Schedule parse_schedule(const std::string& name);  // "gpipe", "1f1b", "interleaved", "zb"

enum OpKind : int32_t { kForward = 0, kBackward = 1, kWeight = 2 };  // kBackward: full, or input-grad under "zb"
struct Op {
  int32_t stage;  // global stage: local * pp + rank under the looped (interleaved, zb) placement
  int32_t kind;
  int32_t mb;
};

// Per rank, the ops in the order the torch schedule issues them (its no-op slots dropped).
std::vector<std::vector<Op>> rank_orders(Schedule schedule, int64_t pp, int64_t virtual_stages, int64_t m);

// Costs of one step, per micro-batch and global stage, row-major [m][S] (S = pp * virtual_stages).
struct StageCosts {
  int64_t m = 0, stages = 0;
  std::vector<double> fwd, bwd, wgt;  // wgt: the weight-grad part split off bwd under "zb" (else zeros)
};

struct SimResult {
  double makespan = 0.0;
  std::vector<double> busy;  // per rank
  double lower_bound = 0.0;  // certified: no order of these micro-batches on these ranks finishes sooner
};

// Simulates the rank orders (an op starts when its rank is free and its inputs have arrived, p2p per hop between
// ranks). Throws std::invalid_argument on a deadlocked order (never for the orders above).
SimResult simulate(const std::vector<std::vector<Op>>& orders, const StageCosts& c, int64_t pp, double p2p);
double lower_bound(const StageCosts& c, int64_t pp, bool split_weight, double p2p);

// Per-micro-batch forward costs -> StageCosts: stage share from layer weights (S of them, or empty for even),
// backward = bwd_ratio x forward, and under "zb" a weight_fraction of it moved to the W op.
StageCosts stage_costs(const double* mb_fwd, int64_t m, int64_t stages, const std::vector<double>& layer_weights,
                       double bwd_ratio, double weight_fraction, bool split_weight);

struct PipelineOptions {
  int64_t capacity = 0, pp = 1, dp = 1, m = 0;  // m: micro-batches (rows) per DP rank; 0: the fewest that fit
  Schedule schedule = Schedule::OneFOneB;
  int64_t virtual_stages = 1, microbatch_group = 1;
  std::vector<double> layer_weights;
  double bwd_ratio = 2.0, weight_fraction = 0.5, p2p = 0.0;
  double row_base = 0.0;  // forward cost every micro-batch pays whatever it holds (its padding to one shape)
  int64_t order_rounds = 64;  // swap rounds of the order search per DP rank
};

struct PipelinePlan {
  std::vector<int64_t> docs;        // document ids, grouped by row (micro-batch)
  std::vector<int64_t> row_offsets;  // dp * m + 1 offsets into docs; rank r's rows are [r * m, (r + 1) * m)
  std::vector<double> rank_makespan, rank_bound, row_cost;
  int64_t m = 0;
  double makespan = 0.0, lower_bound = 0.0, data_bound = 0.0;
};

// The fewest micro-batches per rank that the schedule accepts at or above `at_least`.
int64_t valid_microbatches(Schedule schedule, int64_t pp, int64_t virtual_stages, int64_t microbatch_group,
                           int64_t at_least);
std::string microbatch_rule(Schedule schedule, int64_t pp, int64_t virtual_stages, int64_t microbatch_group,
                            int64_t m);  // "" when m is accepted, else why not

PipelinePlan plan_pipeline(const int64_t* lengths, const double* doc_cost, int64_t n, const PipelineOptions& opts);

}  // namespace pipeline
}  // namespace packkit
