// Rows that ramp: a rank's documents re-cut into micro-batches light at both ends and heavy in the middle.
// Under 1F1B the first micro-batch's forward crosses every stage before the last rank starts and the last one's
// backward crosses them all after the last rank ends; equal rows make both as long as an average row. A local search
// over the rows of sft-like steps (1.5 documents a micro-batch) found its best steps with this shape, 10-13% shorter
// than equal rows; a triangle of costs min(i + 1, m - i)^e cut greedily keeps most of that at a few simulations.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "pipeline_layout.hpp"

namespace packkit {
namespace pipeline {
namespace detail {

namespace {

// Documents (heaviest first) into m rows whose costs follow `shape`: each to the row furthest below its share of
// the rank's cost that has room, an empty row while as many documents are left as rows are empty. false when a
// document fits no row.
bool shaped_rows(const std::vector<int64_t>& docs, const int64_t* len, const double* cost, const std::vector<double>& shape,
                 int64_t capacity, Rows& out) {
  const size_t m = shape.size();
  double total = 0.0, weight = 0.0;
  for (int64_t d : docs) total += cost[d];
  for (double s : shape) weight += s;
  out.docs.assign(m, {});
  out.tokens.assign(m, 0);
  out.cost.assign(m, 0.0);
  size_t empty = m;
  for (size_t j = 0; j < docs.size(); ++j) {
    const int64_t d = docs[j];
    const bool must_fill = docs.size() - j <= empty;
    size_t row = m;
    double deficit = 0.0;
    for (size_t i = 0; i < m; ++i) {
      if (out.tokens[i] + len[d] > capacity || (must_fill && !out.docs[i].empty())) continue;
      const double want = shape[i] / weight * total - out.cost[i];
      if (row == m || want > deficit) row = i, deficit = want;
    }
    if (row == m) return false;
    if (out.docs[row].empty()) --empty;
    out.docs[row].push_back(d);
    out.tokens[row] += len[d];
    out.cost[row] += cost[d];
  }
  return empty == 0;
}

}  // namespace

void reshape_ranks(const OrderSearch& search, Layout& layout, Ordered& ordered, const int64_t* len, const double* cost,
                   int64_t capacity, int64_t rounds) {
  Rows& rows = layout.rows;
  // The step is its slowest rank: re-cut ranks slowest first, and stop at the first that does not get faster (the
  // step cannot then get shorter).
  std::vector<char> tried(layout.rank_rows.size(), 0);
  for (size_t attempt = 0; attempt < layout.rank_rows.size(); ++attempt) {
    size_t r = layout.rank_rows.size();
    for (size_t k = 0; k < layout.rank_rows.size(); ++k)
      if (!tried[k] && (r == layout.rank_rows.size() || ordered.ranks[k].time > ordered.ranks[r].time)) r = k;
    tried[r] = 1;
    RankOrder& now = ordered.ranks[r];
    if (!(now.time > now.bound * (1.0 + 1e-12))) break;  // at its bound: nothing to gain
    const std::vector<int64_t>& ids = layout.rank_rows[r];
    const size_t m = ids.size();
    if (m < 3) break;
    std::vector<int64_t> docs;
    for (int64_t row : ids) docs.insert(docs.end(), rows.docs[static_cast<size_t>(row)].begin(), rows.docs[static_cast<size_t>(row)].end());
    if (docs.size() <= m) break;  // one document a row: there is nothing to re-cut
    std::stable_sort(docs.begin(), docs.end(), [&](int64_t x, int64_t y) {
      return cost[x] > cost[y] || (cost[x] == cost[y] && (len[x] > len[y] || (len[x] == len[y] && x < y)));
    });
    // local row ids 0..m-1 in position order (the shape's own order), and heaviest first (order_rank's start)
    std::vector<int64_t> position(m);
    std::iota(position.begin(), position.end(), int64_t{0});
    auto heaviest = [&](const Rows& cut) {
      std::vector<int64_t> ids_by_cost(position);
      sort_heaviest_first(ids_by_cost, cut);
      return ids_by_cost;
    };
    Rows best_rows;
    RankOrder best;
    for (double e : {1.0, 1.5, 2.0}) {
      std::vector<double> shape(m);
      for (size_t i = 0; i < m; ++i) shape[i] = std::pow(static_cast<double>(std::min(i + 1, m - i)), e);
      Rows cut;
      if (!shaped_rows(docs, len, cost, shape, capacity, cut)) continue;
      RankOrder got = order_rank(search, cut.cost, heaviest(cut), std::min<int64_t>(rounds, 8), static_cast<int64_t>(r),
                                 &position);
      if (best.order.empty() || got.time < best.time) best = std::move(got), best_rows = std::move(cut);
    }
    if (best.order.empty()) break;
    if (rounds > 8)  // the winning cut searched in full, from its best order
      best = order_rank(search, best_rows.cost, heaviest(best_rows), rounds, static_cast<int64_t>(r), &best.order);
    if (!(best.time < now.time)) break;
    // the rank keeps its row ids; row k of the cut goes to the k-th of them
    for (size_t k = 0; k < m; ++k) {
      const auto row = static_cast<size_t>(ids[k]);
      rows.docs[row] = std::move(best_rows.docs[k]);
      rows.tokens[row] = best_rows.tokens[k];
      rows.cost[row] = best_rows.cost[k];
    }
    for (int64_t& k : best.order) k = ids[static_cast<size_t>(k)];
    std::vector<int64_t> heavy(ids);
    sort_heaviest_first(heavy, rows);
    layout.rank_rows[r] = std::move(heavy);
    now = std::move(best);
  }
  totals(ordered);
}

}  // namespace detail
}  // namespace pipeline
}  // namespace packkit
