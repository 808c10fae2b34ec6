// The pipeline-aware plan (pipeline_plan.hpp): the number of micro-batches, two candidate layouts of documents into
// dp * m rows (pipeline_layout.cpp), per rank the row order the simulator finds fastest and the rebalancing of the
// slowest rank (pipeline_order.cpp), and the bound over any plan.
#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <utility>

#include "pipeline_layout.hpp"
#include "pipeline_plan.hpp"

namespace packkit {
namespace pipeline {
using namespace detail;  // NOLINT: the plan is assembled from its pieces

PipelinePlan plan_pipeline(const int64_t* len, const double* cost, int64_t n, const PipelineOptions& o) {
  if (o.capacity < 1 || o.pp < 1 || o.dp < 1 || o.virtual_stages < 1 || o.microbatch_group < 1 || o.m < 0)
    throw std::invalid_argument("plan_pipeline: capacity, pp, dp, virtual_stages, microbatch_group must be >= 1");
  const int64_t stages = o.pp * o.virtual_stages;
  if (!o.layer_weights.empty() && static_cast<int64_t>(o.layer_weights.size()) != stages)
    throw std::invalid_argument("layer_cost must have pp_size * virtual_stages entries");
  int64_t total_tokens = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (len[i] < 1 || len[i] > o.capacity)
      throw std::invalid_argument("lengths[" + std::to_string(i) + "] = " + std::to_string(len[i]) +
                                  " is outside [1, capacity]");
    total_tokens += len[i];
  }
  if (n < o.dp) throw std::invalid_argument("fewer documents than dp_size: a DP rank would get no micro-batch");
  std::vector<int64_t> by_cost(static_cast<size_t>(n));
  std::iota(by_cost.begin(), by_cost.end(), int64_t{0});
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int64_t x, int64_t y) {
    return cost[x] > cost[y] || (cost[x] == cost[y] && len[x] > len[y]);
  });
  // The fewest rows per rank that the schedule accepts and the tokens fill; grown until the documents fit.
  int64_t m = o.m;
  const int64_t max_m = n / o.dp;  // every row holds at least one document
  if (m == 0) {
    const int64_t fill = (total_tokens + o.capacity * o.dp - 1) / (o.capacity * o.dp);
    m = valid_microbatches(o.schedule, o.pp, o.virtual_stages, o.microbatch_group, fill);
  }
  Rows rows;
  for (;;) {
    if (m > max_m)
      throw std::invalid_argument("num_microbatches: " + std::to_string(m) + " micro-batches per DP rank x dp_size " +
                                  std::to_string(o.dp) + " is more rows than the " + std::to_string(n) +
                                  " documents (every micro-batch holds at least one)");
    const std::string why = microbatch_rule(o.schedule, o.pp, o.virtual_stages, o.microbatch_group, m);
    if (!why.empty()) throw std::invalid_argument("num_microbatches = " + std::to_string(m) + " " + why);
    if (balanced_rows(by_cost, len, cost, m * o.dp, o.capacity, rows)) break;
    std::vector<int64_t> by_len(by_cost);
    std::stable_sort(by_len.begin(), by_len.end(), [&](int64_t x, int64_t y) { return len[x] > len[y]; });
    if (first_fit_rows(by_len, len, cost, m * o.dp, o.capacity, rows)) break;
    if (o.m != 0)
      throw std::invalid_argument("num_microbatches = " + std::to_string(m) + " x dp_size rows of capacity " +
                                  std::to_string(o.capacity) + " cannot hold these documents");
    m = valid_microbatches(o.schedule, o.pp, o.virtual_stages, o.microbatch_group, m + 1);
  }
  // Candidate layouts, each ordered per rank by the simulator; the faster step wins (ties: the first).
  // A: equal-cost rows dealt to ranks (best when no document outweighs a row); B: documents dealt to ranks by cost
  // first, then each rank's own balanced rows (a rank holding an outlier gets lighter rows beside it).
  std::vector<Layout> layouts;
  layouts.push_back(deal_rows(std::move(rows), o.dp, m));
  Layout by_rank;
  if (o.dp > 1 && ranks_first(by_cost, len, cost, n, o.dp, m, o.capacity, by_rank)) layouts.push_back(std::move(by_rank));
  // k = 1..3 outliers isolated, and, when a step has more, every document whose own path outlasts an average rank's
  // busiest stage (cost over total / (dp * pp)): thousands of documents hold several
  double total_cost = 0.0;
  for (int64_t i = 0; i < n; ++i) total_cost += cost[i];
  int64_t dominant = 0;
  while (dominant < n && cost[by_cost[static_cast<size_t>(dominant)]] > total_cost / static_cast<double>(o.dp * o.pp))
    ++dominant;
  std::vector<int64_t> ks{1, 2, 3};
  if (dominant > 3) ks.push_back(dominant);
  for (int64_t k : ks) {
    Layout isolated;
    if (o.dp < 2 || !isolate_outliers(by_cost, len, cost, n, o.dp, m, o.capacity, k, isolated)) break;
    layouts.push_back(std::move(isolated));
  }
  OrderSearch search{o, rank_orders(o.schedule, o.pp, o.virtual_stages, m), stages};
  Ordered best;
  size_t chosen = 0;
  // candidates compared with a short order search, the winner searched in full
  const int64_t trial_rounds = layouts.size() > 1 ? std::min<int64_t>(o.order_rounds, 8) : o.order_rounds;
  for (size_t c = 0; c < layouts.size(); ++c) {
    Ordered got = order_ranks(search, layouts[c], trial_rounds);
    if (c == 0 || got.makespan < best.makespan) best = std::move(got), chosen = c;
  }
  if (trial_rounds < o.order_rounds) best = order_ranks(search, layouts[chosen], o.order_rounds);
  // Equal rows are not the fastest rows: light first and last micro-batches shorten the fill and the drain.
  reshape_ranks(search, layouts[chosen], best, len, cost, o.capacity, o.order_rounds);
  // Equal work is not equal time when a rank holds an outlier: move documents off the slowest rank while it helps.
  if (o.dp > 1) rebalance(search, layouts[chosen], best, len, cost, o.capacity, o.order_rounds, 8 * o.dp);
  const Rows& rows_out = layouts[chosen].rows;
  PipelinePlan plan;
  plan.m = m;
  plan.row_offsets.push_back(0);
  for (const RankOrder& rank : best.ranks) {
    for (int64_t row : rank.order) {
      const auto& d = rows_out.docs[static_cast<size_t>(row)];
      plan.docs.insert(plan.docs.end(), d.begin(), d.end());
      plan.row_offsets.push_back(static_cast<int64_t>(plan.docs.size()));
      plan.row_cost.push_back(rows_out.cost[static_cast<size_t>(row)]);
    }
    plan.rank_makespan.push_back(rank.time);
    plan.rank_bound.push_back(rank.bound);
  }
  plan.makespan = best.makespan;
  plan.lower_bound = best.lower_bound;
  // Over every plan of these documents at this m: the per-rank work share of the total, the heaviest document's path.
  double total = 0.0, heaviest = 0.0;
  for (int64_t i = 0; i < n; ++i) total += cost[i], heaviest = std::max(heaviest, cost[i]);
  const std::vector<double> one{total / static_cast<double>(o.dp) + static_cast<double>(m) * o.row_base},
      top{heaviest + o.row_base};
  const bool split = o.schedule == Schedule::ZeroBubble;
  StageCosts avg = stage_costs(one.data(), 1, stages, o.layer_weights, o.bwd_ratio, o.weight_fraction, split);
  double share = 0.0;
  for (int64_t rr = 0; rr < std::min(o.pp, stages); ++rr) {
    double w = 0.0;
    for (int64_t g = rr; g < stages; g += o.pp) w += avg.fwd[static_cast<size_t>(g)] + avg.bwd[static_cast<size_t>(g)] + avg.wgt[static_cast<size_t>(g)];
    share = std::max(share, w);
  }
  StageCosts big = stage_costs(top.data(), 1, stages, o.layer_weights, o.bwd_ratio, o.weight_fraction, split);
  plan.data_bound = std::max(share, lower_bound(big, o.pp, split, o.p2p));
  return plan;
}

}  // namespace pipeline
}  // namespace packkit
