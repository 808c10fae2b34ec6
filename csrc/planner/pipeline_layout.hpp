// Internal pieces of the pipeline plan (pipeline_plan.cpp): candidate layouts of documents into rows and rows
// onto DP ranks (pipeline_layout.cpp), and the simulator-driven row order and rank rebalancing (pipeline_order.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "pipeline_plan.hpp"

namespace packkit {
namespace pipeline {
namespace detail {

struct Rows {
  std::vector<std::vector<int64_t>> docs;
  std::vector<int64_t> tokens;
  std::vector<double> cost;
};

struct Layout {
  Rows rows;
  std::vector<std::vector<int64_t>> rank_rows;  // per rank, its m row ids, heaviest first
};

// Heaviest document first into the lightest row that has room; false when a document fits no row.
bool balanced_rows(const std::vector<int64_t>& by_cost, const int64_t* len, const double* cost, int64_t rows,
                   int64_t capacity, Rows& out);
// First fit by tokens, longest first: the fallback when balancing strands a document.
bool first_fit_rows(const std::vector<int64_t>& by_len, const int64_t* len, const double* cost, int64_t rows,
                    int64_t capacity, Rows& out);
// Rows -> ranks: heaviest row to the lightest rank with fewer than m rows.
Layout deal_rows(Rows rows, int64_t dp, int64_t m);
// Documents -> ranks by cost first, then each rank's own m balanced rows; false when a rank's documents do not fit.
bool ranks_first(const std::vector<int64_t>& by_cost, const int64_t* len, const double* cost, int64_t n, int64_t dp,
                 int64_t m, int64_t capacity, Layout& out);
// The k heaviest documents, each on a rank of its own with m - 1 of the lightest beside it, one a row (under 1F1B
// an outlier's rank runs about its path plus the rest of its work: the rest is best kept light); the others dealt
// as ranks_first. false unless all k are outliers (heavier than two average rows), k < dp, and they fit.
bool isolate_outliers(const std::vector<int64_t>& by_cost, const int64_t* len, const double* cost, int64_t n,
                      int64_t dp, int64_t m, int64_t capacity, int64_t k, Layout& out);

struct OrderSearch {
  const PipelineOptions& o;
  std::vector<std::vector<Op>> orders;
  int64_t stages;
  double eval(const std::vector<double>& rows_fwd, double* bound) const {
    std::vector<double> padded;  // only when rows pay a base: the search runs this thousands of times a plan
    if (o.row_base != 0.0) {
      padded = rows_fwd;
      for (double& f : padded) f += o.row_base;
    }
    const std::vector<double>& mb_fwd = o.row_base != 0.0 ? padded : rows_fwd;
    const StageCosts c = stage_costs(mb_fwd.data(), static_cast<int64_t>(mb_fwd.size()), stages, o.layer_weights,
                                     o.bwd_ratio, o.weight_fraction, o.schedule == Schedule::ZeroBubble);
    const SimResult s = simulate(orders, c, o.pp, o.p2p);
    if (bound) *bound = s.lower_bound;
    return s.makespan;
  }
};

struct RankOrder {
  std::vector<int64_t> order;  // row ids in schedule order
  double time = 0.0, bound = 0.0;
};

struct Ordered {
  std::vector<RankOrder> ranks;
  double makespan = 0.0, lower_bound = 0.0;
};

// One rank's rows (heaviest first) in the order the simulator finds fastest; the same rows and rank give the same
// order. `start`, if given, is one more order to start from (the rank's current one).
RankOrder order_rank(const OrderSearch& search, const std::vector<double>& row_cost, const std::vector<int64_t>& mine,
                     int64_t rounds, int64_t rank, const std::vector<int64_t>* start = nullptr);
Ordered order_ranks(const OrderSearch& search, const Layout& layout, int64_t rounds);
void totals(Ordered& out);  // the step's makespan and bound: the slowest rank's
void sort_heaviest_first(std::vector<int64_t>& ids, const Rows& rows);
// Moves documents from the slowest rank to the fastest while that shortens the slower of the two (at most
// max_moves), re-ordering both.
void rebalance(const OrderSearch& search, Layout& layout, Ordered& ordered, const int64_t* len, const double* cost,
               int64_t capacity, int64_t rounds, int64_t max_moves);
// Each rank's documents re-cut into rows that ramp up and back down (pipeline_reshape.cpp); a rank keeps the new rows
// only when its simulated step gets shorter.
void reshape_ranks(const OrderSearch& search, Layout& layout, Ordered& ordered, const int64_t* len, const double* cost,
                   int64_t capacity, int64_t rounds);

}  // namespace detail
}  // namespace pipeline
}  // namespace packkit
