// Candidate layouts of a pipeline step's documents: rows of <= capacity tokens balanced by cost, and their DP ranks.
#include <algorithm>
#include <climits>
#include <numeric>
#include <queue>
#include <utility>

#include "pipeline_layout.hpp"

namespace packkit {
namespace pipeline {
namespace detail {


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
  std::vector<double> load(static_cast<size_t>(dp), 0.0);
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
    load[r] += cost[d];
    lightest.push({load[r], rank});
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

bool isolate_outliers(const std::vector<int64_t>& by_cost, const int64_t* len, const double* cost, int64_t n,
                      int64_t dp, int64_t m, int64_t capacity, int64_t k, Layout& out) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += cost[i];
  const double two_rows = 2.0 * total / static_cast<double>(dp * m);
  if (k < 1 || k > dp - 1 || k > n || cost[by_cost[static_cast<size_t>(k - 1)]] <= two_rows ||
      n - k - (m - 1) * k < (dp - k) * m)
    return false;
  const auto light_from = by_cost.end() - (m - 1) * k;  // the lightest documents, (m - 1) per isolated rank
  const std::vector<int64_t> middle(by_cost.begin() + k, light_from);
  Layout rest;
  if (!ranks_first(middle, len, cost, static_cast<int64_t>(middle.size()), dp - k, m, capacity, rest)) return false;
  out = Layout{};
  auto add_row = [&](std::vector<int64_t> docs) {
    int64_t t = 0;
    double c = 0.0;
    for (int64_t d : docs) t += len[d], c += cost[d];
    out.rows.docs.push_back(std::move(docs));
    out.rows.tokens.push_back(t);
    out.rows.cost.push_back(c);
    return static_cast<int64_t>(out.rows.cost.size()) - 1;
  };
  for (int64_t j = 0; j < k; ++j) {
    std::vector<int64_t> ids{add_row({by_cost[static_cast<size_t>(j)]})};
    for (int64_t t = 0; t < m - 1; ++t) ids.push_back(add_row({*(light_from + j * (m - 1) + t)}));  // heaviest first
    out.rank_rows.push_back(std::move(ids));
  }
  const auto base = static_cast<int64_t>(out.rows.cost.size());
  for (size_t i = 0; i < rest.rows.cost.size(); ++i) add_row(std::move(rest.rows.docs[i]));
  for (auto& ids : rest.rank_rows) {
    for (int64_t& id : ids) id += base;
    out.rank_rows.push_back(std::move(ids));
  }
  return true;
}

}  // namespace detail
}  // namespace pipeline
}  // namespace packkit
