// The pipeline-aware plan (pipeline_plan.hpp): documents -> dp * m rows of <= capacity tokens balanced by cost,
// rows -> DP ranks (m each, balanced), and per rank the row order that the simulator finds fastest.
#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <utility>

#include "pipeline_plan.hpp"

namespace packkit {
namespace pipeline {
namespace {

struct Rows {
  std::vector<std::vector<int64_t>> docs;
  std::vector<int64_t> tokens;
  std::vector<double> cost;
};

// Heaviest document first into the lightest row that has room (every row seeded by one document, so none is
// empty). false when a document fits no row.
bool balanced_rows(const std::vector<int64_t>& by_cost, const int64_t* len, const double* cost, int64_t rows,
                   int64_t capacity, Rows& out) {
  out.docs.assign(static_cast<size_t>(rows), {});
  out.tokens.assign(static_cast<size_t>(rows), 0);
  out.cost.assign(static_cast<size_t>(rows), 0.0);
  using Entry = std::pair<double, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> lightest;
  std::vector<Entry> unfit;
  for (size_t j = 0; j < by_cost.size(); ++j) {
    const int64_t d = by_cost[j];
    int64_t row = -1;
    if (static_cast<int64_t>(j) < rows) {
      row = static_cast<int64_t>(j);
    } else {
      while (!lightest.empty()) {
        const Entry e = lightest.top();
        lightest.pop();
        if (out.tokens[static_cast<size_t>(e.second)] + len[d] <= capacity) {
          row = e.second;
          break;
        }
        unfit.push_back(e);  // full for this document; a shorter one later may still fit
      }
      for (const Entry& e : unfit) lightest.push(e);
      unfit.clear();
      if (row < 0) return false;
    }
    const auto r = static_cast<size_t>(row);
    out.docs[r].push_back(d);
    out.tokens[r] += len[d];
    out.cost[r] += cost[d];
    lightest.push({out.cost[r], row});
  }
  return true;
}

// First fit by tokens, longest first: the fallback when balancing strands a document.
bool first_fit_rows(const std::vector<int64_t>& by_len, const int64_t* len, const double* cost, int64_t rows,
                    int64_t capacity, Rows& out) {
  out.docs.assign(static_cast<size_t>(rows), {});
  out.tokens.assign(static_cast<size_t>(rows), 0);
  out.cost.assign(static_cast<size_t>(rows), 0.0);
  for (size_t j = 0; j < by_len.size(); ++j) {
    const int64_t d = by_len[j];
    size_t r = 0;
    if (static_cast<int64_t>(j) < rows) {
      r = j;
    } else {
      while (r < static_cast<size_t>(rows) && out.tokens[r] + len[d] > capacity) ++r;
      if (r == static_cast<size_t>(rows)) return false;
    }
    out.docs[r].push_back(d);
    out.tokens[r] += len[d];
    out.cost[r] += cost[d];
  }
  return true;
}

struct OrderSearch {
  const PipelineOptions& o;
  std::vector<std::vector<Op>> orders;
  int64_t stages;
  double eval(const std::vector<double>& mb_fwd, double* bound) const {
    const StageCosts c = stage_costs(mb_fwd.data(), static_cast<int64_t>(mb_fwd.size()), stages, o.layer_weights,
                                     o.bwd_ratio, o.weight_fraction, o.schedule == Schedule::ZeroBubble);
    const SimResult s = simulate(orders, c, o.pp, o.p2p);
    if (bound) *bound = s.lower_bound;
    return s.makespan;
  }
};

struct Layout {
  Rows rows;
  std::vector<std::vector<int64_t>> rank_rows;  // per rank, its m row ids, heaviest first
};

// Rows -> ranks: heaviest row to the lightest rank with fewer than m rows.
Layout deal_rows(Rows rows, int64_t dp, int64_t m) {
  Layout out;
  const auto R = static_cast<int64_t>(rows.cost.size());
  std::vector<int64_t> row_ids(static_cast<size_t>(R));
  std::iota(row_ids.begin(), row_ids.end(), int64_t{0});
  std::stable_sort(row_ids.begin(), row_ids.end(), [&](int64_t x, int64_t y) {
    return rows.cost[static_cast<size_t>(x)] > rows.cost[static_cast<size_t>(y)];
  });
  out.rank_rows.assign(static_cast<size_t>(dp), {});
  using Entry = std::pair<double, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> lightest;
  for (int64_t r = 0; r < dp; ++r) lightest.push({0.0, r});
  for (int64_t row : row_ids) {
    const Entry e = lightest.top();
    lightest.pop();
    auto& mine = out.rank_rows[static_cast<size_t>(e.second)];
    mine.push_back(row);
    if (static_cast<int64_t>(mine.size()) < m) lightest.push({e.first + rows.cost[static_cast<size_t>(row)], e.second});
  }
  out.rows = std::move(rows);
  return out;
}

// Documents -> ranks, heaviest to the lightest rank (one that still needs documents to fill its m rows first when
// the rest would run short), then each rank's documents into its own m balanced rows. false when a rank's documents
// do not fit its rows.
bool ranks_first(const std::vector<int64_t>& by_cost, const int64_t* len, const double* cost, int64_t n, int64_t dp,
                 int64_t m, int64_t capacity, Layout& out) {
  std::vector<std::vector<int64_t>> mine(static_cast<size_t>(dp));
  std::vector<int64_t> tokens(static_cast<size_t>(dp), 0);
  using Entry = std::pair<double, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> lightest;
  for (int64_t r = 0; r < dp; ++r) lightest.push({0.0, r});
  int64_t short_of = dp * m;  // documents the ranks still need to give every row one
  const int64_t room = capacity > INT64_MAX / m ? INT64_MAX : capacity * m;  // a rank's tokens, at most
  std::vector<Entry> skipped;
  for (size_t j = 0; j < by_cost.size(); ++j) {
    const int64_t d = by_cost[j];
    const int64_t left = n - static_cast<int64_t>(j);  // documents not yet placed, d included
    int64_t rank = -1;
    while (!lightest.empty()) {
      const Entry e = lightest.top();
      lightest.pop();
      const auto r = static_cast<size_t>(e.second);
      const bool full = static_cast<int64_t>(mine[r].size()) >= m;
      // a rank that has its m documents takes more only while the others can still be given theirs
      if ((full && left <= short_of) || len[d] > room - tokens[r]) {
        skipped.push_back(e);
        continue;
      }
      rank = e.second;
      break;
    }
    for (const Entry& e : skipped) lightest.push(e);
    skipped.clear();
    if (rank < 0) return false;
    const auto r = static_cast<size_t>(rank);
    if (static_cast<int64_t>(mine[r].size()) < m) --short_of;
    mine[r].push_back(d);
    tokens[r] += len[d];
    Entry e{0.0, rank};
    double w = 0.0;
    for (int64_t x : mine[r]) w += cost[x];
    e.first = w;
    lightest.push(e);
  }
  out.rows = Rows{};
  out.rank_rows.assign(static_cast<size_t>(dp), {});
  for (int64_t r = 0; r < dp; ++r) {
    const auto& docs = mine[static_cast<size_t>(r)];  // heaviest first: by_cost order
    Rows part;
    if (!balanced_rows(docs, len, cost, m, capacity, part)) {
      std::vector<int64_t> by_len(docs);
      std::stable_sort(by_len.begin(), by_len.end(), [&](int64_t x, int64_t y) { return len[x] > len[y]; });
      if (!first_fit_rows(by_len, len, cost, m, capacity, part)) return false;
    }
    const auto base = static_cast<int64_t>(out.rows.cost.size());
    std::vector<int64_t> ids(static_cast<size_t>(m));
    std::iota(ids.begin(), ids.end(), base);
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t x, int64_t y) {
      return part.cost[static_cast<size_t>(x - base)] > part.cost[static_cast<size_t>(y - base)];
    });
    for (int64_t k = 0; k < m; ++k) {
      out.rows.docs.push_back(std::move(part.docs[static_cast<size_t>(k)]));
      out.rows.tokens.push_back(part.tokens[static_cast<size_t>(k)]);
      out.rows.cost.push_back(part.cost[static_cast<size_t>(k)]);
    }
    out.rank_rows[static_cast<size_t>(r)] = std::move(ids);
  }
  return true;
}

struct Ordered {
  std::vector<std::vector<int64_t>> order;  // per rank, its row ids in schedule order
  std::vector<double> time, bound;
  double makespan = 0.0, lower_bound = 0.0;
};

// Per rank: the best of a few shapes (heavy first, light first, light at both ends, light at the ends with the
// heaviest next to them), then pairwise swaps that shorten the simulated step.
Ordered order_ranks(const OrderSearch& search, const Layout& layout, int64_t m, int64_t rounds) {
  Ordered out;
  std::vector<double> fwd(static_cast<size_t>(m));
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  for (const auto& mine : layout.rank_rows) {  // heaviest first
    auto fill = [&](const std::vector<int64_t>& order) {
      for (size_t i = 0; i < order.size(); ++i) fwd[i] = layout.rows.cost[static_cast<size_t>(order[i])];
    };
    std::vector<std::vector<int64_t>> shapes;
    shapes.push_back(mine);
    shapes.emplace_back(mine.rbegin(), mine.rend());
    if (m >= 3) {
      std::vector<int64_t> ends(mine.begin(), mine.end() - 2);
      ends.insert(ends.begin(), mine[mine.size() - 1]);
      ends.push_back(mine[mine.size() - 2]);
      shapes.push_back(ends);
      std::vector<int64_t> hill(mine.size());  // lightest at the two ends, heaviest in the middle
      size_t lo = 0, hi = mine.size();
      for (size_t k = 0; k < mine.size(); ++k) hill[k % 2 ? --hi : lo++] = mine[mine.size() - 1 - k];
      shapes.push_back(hill);
    }
    std::vector<int64_t> best;
    double best_t = 0.0, bound = 0.0;
    for (const auto& s : shapes) {
      fill(s);
      double b = 0.0;
      const double t = search.eval(fwd, &b);
      if (best.empty() || t < best_t) best = s, best_t = t, bound = b;
    }
    for (int64_t round = 0; round < rounds && m >= 2 && best_t > bound * (1.0 + 1e-12); ++round) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      const auto i = static_cast<size_t>(rng % static_cast<uint64_t>(m));
      const auto j = static_cast<size_t>((rng >> 32) % static_cast<uint64_t>(m));
      if (i == j) continue;
      std::swap(best[i], best[j]);
      fill(best);
      const double t = search.eval(fwd, nullptr);
      if (t < best_t) best_t = t;
      else std::swap(best[i], best[j]);
    }
    out.order.push_back(std::move(best));
    out.time.push_back(best_t);
    out.bound.push_back(bound);
    out.makespan = std::max(out.makespan, best_t);
    out.lower_bound = std::max(out.lower_bound, bound);
  }
  return out;
}

}  // namespace

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
  // Two candidate layouts, each ordered per rank by the simulator; the faster step wins (ties: the first).
  // A: equal-cost rows dealt to ranks (best when no document outweighs a row); B: documents dealt to ranks by cost
  // first, then each rank's own balanced rows (a rank holding an outlier gets lighter rows beside it).
  std::vector<Layout> layouts;
  layouts.push_back(deal_rows(std::move(rows), o.dp, m));
  Layout by_rank;
  if (o.dp > 1 && ranks_first(by_cost, len, cost, n, o.dp, m, o.capacity, by_rank)) layouts.push_back(std::move(by_rank));
  OrderSearch search{o, rank_orders(o.schedule, o.pp, o.virtual_stages, m), stages};
  Ordered best;
  size_t chosen = 0;
  for (size_t c = 0; c < layouts.size(); ++c) {
    Ordered got = order_ranks(search, layouts[c], m, o.order_rounds);
    if (c == 0 || got.makespan < best.makespan) best = std::move(got), chosen = c;
  }
  const Rows& rows_out = layouts[chosen].rows;
  PipelinePlan plan;
  plan.m = m;
  plan.row_offsets.push_back(0);
  for (int64_t r = 0; r < o.dp; ++r) {
    for (int64_t row : best.order[static_cast<size_t>(r)]) {
      const auto& d = rows_out.docs[static_cast<size_t>(row)];
      plan.docs.insert(plan.docs.end(), d.begin(), d.end());
      plan.row_offsets.push_back(static_cast<int64_t>(plan.docs.size()));
      plan.row_cost.push_back(rows_out.cost[static_cast<size_t>(row)]);
    }
  }
  plan.rank_makespan = best.time;
  plan.rank_bound = best.bound;
  plan.makespan = best.makespan;
  plan.lower_bound = best.lower_bound;
  // Over every plan of these documents at this m: the per-rank work share of the total, the heaviest document's path.
  double total = 0.0, heaviest = 0.0;
  for (int64_t i = 0; i < n; ++i) total += cost[i], heaviest = std::max(heaviest, cost[i]);
  const std::vector<double> one{total / static_cast<double>(o.dp)}, top{heaviest};
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
