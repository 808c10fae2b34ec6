// The row order of each DP rank that the pipeline simulator finds fastest, and the rebalancing of the slowest rank.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "pipeline_layout.hpp"

namespace packkit {
namespace pipeline {
namespace detail {

RankOrder order_rank(const OrderSearch& search, const std::vector<double>& row_cost, const std::vector<int64_t>& mine,
                     int64_t rounds, int64_t rank, const std::vector<int64_t>* start) {
  const size_t m = mine.size();
  std::vector<double> fwd(m);
  auto fill = [&](const std::vector<int64_t>& order) {
    for (size_t i = 0; i < m; ++i) fwd[i] = row_cost[static_cast<size_t>(order[i])];
  };
  // heavy first, light first, light at both ends, light at the ends with the heaviest next to them
  std::vector<std::vector<int64_t>> shapes;
  shapes.push_back(mine);
  shapes.emplace_back(mine.rbegin(), mine.rend());
  if (m >= 3) {
    std::vector<int64_t> ends(mine.begin(), mine.end() - 2);
    ends.insert(ends.begin(), mine[m - 1]);
    ends.push_back(mine[m - 2]);
    shapes.push_back(ends);
    std::vector<int64_t> hill(m);
    size_t lo = 0, hi = m;
    for (size_t k = 0; k < m; ++k) hill[k % 2 ? --hi : lo++] = mine[m - 1 - k];
    shapes.push_back(hill);
  }
  if (start && start->size() == m) shapes.push_back(*start);
  RankOrder best;
  for (const auto& s : shapes) {
    fill(s);
    double b = 0.0;
    const double t = search.eval(fwd, &b);
    if (best.order.empty() || t < best.time) best.order = s, best.time = t, best.bound = b;
  }
  // pairwise swaps that shorten the simulated step; a seed per rank, so one rank re-ordered alone gets its order
  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull);
  for (int64_t round = 0; round < rounds && m >= 2 && best.time > best.bound * (1.0 + 1e-12); ++round) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const auto i = static_cast<size_t>(rng % m);
    const auto j = static_cast<size_t>((rng >> 32) % m);
    if (i == j) continue;
    std::swap(best.order[i], best.order[j]);
    fill(best.order);
    const double t = search.eval(fwd, nullptr);
    if (t < best.time) best.time = t;
    else std::swap(best.order[i], best.order[j]);
  }
  return best;
}

void totals(Ordered& out) {
  out.makespan = out.lower_bound = 0.0;
  for (const RankOrder& r : out.ranks) out.makespan = std::max(out.makespan, r.time), out.lower_bound = std::max(out.lower_bound, r.bound);
}

void sort_heaviest_first(std::vector<int64_t>& ids, const Rows& rows) {
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t x, int64_t y) {
    return rows.cost[static_cast<size_t>(x)] > rows.cost[static_cast<size_t>(y)];
  });
}

Ordered order_ranks(const OrderSearch& search, const Layout& layout, int64_t rounds) {
  Ordered out;
  for (size_t r = 0; r < layout.rank_rows.size(); ++r)
    out.ranks.push_back(order_rank(search, layout.rows.cost, layout.rank_rows[r], rounds, static_cast<int64_t>(r)));
  totals(out);
  return out;
}

void rebalance(const OrderSearch& search, Layout& layout, Ordered& ordered, const int64_t* len, const double* cost,
               int64_t capacity, int64_t rounds, int64_t max_moves) {
  Rows& rows = layout.rows;
  const double per_forward = (1.0 + search.o.bwd_ratio) / static_cast<double>(search.o.pp);  // time per unit of cost
  for (int64_t move = 0; move < max_moves; ++move) {
    size_t slow = 0, fast = 0;
    for (size_t r = 1; r < ordered.ranks.size(); ++r) {
      if (ordered.ranks[r].time > ordered.ranks[slow].time) slow = r;
      if (ordered.ranks[r].time < ordered.ranks[fast].time) fast = r;
    }
    const double gap = ordered.ranks[slow].time - ordered.ranks[fast].time;
    if (slow == fast || !(gap > 0.0)) return;
    const double want = gap / (2.0 * per_forward);  // the cost that would meet in the middle
    // candidates: a document of the slow rank from a row it does not hold alone, the nearest to `want` (one below,
    // one above)
    int64_t below = -1, above = -1, below_row = -1, above_row = -1;
    for (int64_t row : layout.rank_rows[slow]) {
      const auto& docs = rows.docs[static_cast<size_t>(row)];
      if (docs.size() < 2) continue;
      for (int64_t d : docs) {
        if (cost[d] <= want && (below < 0 || cost[d] > cost[below])) below = d, below_row = row;
        if (cost[d] > want && cost[d] < 2.0 * want && (above < 0 || cost[d] < cost[above])) above = d, above_row = row;
      }
    }
    bool moved = false;
    for (auto [d, from] : {std::pair<int64_t, int64_t>{below, below_row}, {above, above_row}}) {
      if (d < 0) continue;
      int64_t to = -1;  // the fast rank's lightest row with room
      for (int64_t row : layout.rank_rows[fast])
        if (len[d] <= capacity - rows.tokens[static_cast<size_t>(row)] &&
            (to < 0 || rows.cost[static_cast<size_t>(row)] < rows.cost[static_cast<size_t>(to)]))
          to = row;
      if (to < 0) continue;
      auto& src = rows.docs[static_cast<size_t>(from)];
      const auto at = std::find(src.begin(), src.end(), d) - src.begin();
      src.erase(src.begin() + at);
      rows.tokens[static_cast<size_t>(from)] -= len[d], rows.cost[static_cast<size_t>(from)] -= cost[d];
      rows.docs[static_cast<size_t>(to)].push_back(d);
      rows.tokens[static_cast<size_t>(to)] += len[d], rows.cost[static_cast<size_t>(to)] += cost[d];
      std::vector<int64_t> slow_ids = layout.rank_rows[slow], fast_ids = layout.rank_rows[fast];
      sort_heaviest_first(slow_ids, rows);
      sort_heaviest_first(fast_ids, rows);
      RankOrder s = order_rank(search, rows.cost, slow_ids, rounds, static_cast<int64_t>(slow), &ordered.ranks[slow].order);
      RankOrder f = order_rank(search, rows.cost, fast_ids, rounds, static_cast<int64_t>(fast), &ordered.ranks[fast].order);
      if (std::max(s.time, f.time) < ordered.ranks[slow].time) {
        layout.rank_rows[slow] = std::move(slow_ids), layout.rank_rows[fast] = std::move(fast_ids);
        ordered.ranks[slow] = std::move(s), ordered.ranks[fast] = std::move(f);
        totals(ordered);
        moved = true;
        break;
      }
      rows.docs[static_cast<size_t>(to)].pop_back();  // undo: the document back where it was
      rows.tokens[static_cast<size_t>(to)] -= len[d], rows.cost[static_cast<size_t>(to)] -= cost[d];
      src.insert(src.begin() + at, d);
      rows.tokens[static_cast<size_t>(from)] += len[d], rows.cost[static_cast<size_t>(from)] += cost[d];
    }
    if (!moved) return;
  }
}

}  // namespace detail
}  // namespace pipeline
}  // namespace packkit
