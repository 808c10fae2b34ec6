// The local search inside one step of the RL micro-batch grid (declared in step_search.hpp).
#include <algorithm>
#include <cstddef>

#include "step_search.hpp"

namespace packkit {
namespace {

// Local search inside one step: parts[r] are rank r's items. Moves (if allowed) or swaps from the costliest rank
// to another rank while that lowers the costliest rank's cost below the old maximum and keeps both within the cap.
constexpr size_t kPartners = 8;  // cheapest ranks tried when the cheapest cannot take from the costliest

void refine_step(std::vector<std::vector<int64_t>>& parts, std::vector<double>& load, std::vector<int64_t>& tok,
                 const int64_t* lengths, const double* costs, int64_t capacity, bool moves, int rounds) {
  const size_t dp = parts.size();
  if (dp < 2) return;
  double total = 0;
  for (double x : load) total += x;
  const double good_enough = total / static_cast<double>(dp) * (1.0 + 1e-5);  // the step's max this close to its mean: stop
  std::vector<size_t> partners;
  partners.reserve(dp);
  // The best move or swap from rank hi to rank lo: kind 1 = move a[i], 2 = swap a[i] with b[k]; 0 = none lowers
  // the pair's larger cost.
  auto best_change = [&](size_t hi, size_t lo, size_t& bi, size_t& bk) {
    const double gap = load[hi] - load[lo];
    int kind = 0;
    if (gap <= 0) return kind;
    const std::vector<int64_t>& a = parts[hi];
    const std::vector<int64_t>& b = parts[lo];
    double best_gain = gap * 1e-9;
    if (moves) {
      for (size_t i = 0; i < a.size(); ++i) {
        const double c = costs[a[i]];
        if (c <= 0 || tok[lo] + lengths[a[i]] > capacity) continue;
        const double gain = std::min(c, gap - c);
        if (gain > best_gain) best_gain = gain, kind = 1, bi = i;
      }
    }
    for (size_t i = 0; i < a.size(); ++i) {
      const double ci = costs[a[i]];
      const int64_t li = lengths[a[i]];
      for (size_t k = 0; k < b.size(); ++k) {
        const double d = ci - costs[b[k]];
        if (d <= best_gain) continue;  // gain = min(d, gap - d) <= d
        const int64_t dl = li - lengths[b[k]];
        if (tok[lo] + dl > capacity || tok[hi] - dl > capacity) continue;
        const double gain = std::min(d, gap - d);
        if (gain > best_gain) best_gain = gain, kind = 2, bi = i, bk = k;
      }
    }
    return kind;
  };
  for (int round = 0; round < rounds; ++round) {
    size_t hi = 0, lo = 0;
    for (size_t r = 1; r < dp; ++r) {
      if (load[r] > load[hi]) hi = r;
      if (load[r] < load[lo]) lo = r;
    }
    if (load[hi] <= good_enough) return;
    size_t bi = 0, bk = 0;
    int kind = best_change(hi, lo, bi, bk);
    if (kind == 0) {  // the cheapest rank cannot help: the next cheapest ones
      partners.clear();
      for (size_t r = 0; r < dp; ++r)
        if (r != hi && r != lo) partners.push_back(r);
      const size_t tried = std::min<size_t>(partners.size(), kPartners);
      std::partial_sort(partners.begin(), partners.begin() + static_cast<std::ptrdiff_t>(tried), partners.end(),
                        [&](size_t a, size_t b) { return load[a] != load[b] ? load[a] < load[b] : a < b; });
      partners.resize(tried);
      for (size_t r : partners) {
        kind = best_change(hi, r, bi, bk);
        if (kind) {
          lo = r;
          break;
        }
      }
      if (kind == 0) return;
    }
    std::vector<int64_t>& a = parts[hi];
    std::vector<int64_t>& b = parts[lo];
    if (kind == 1) {
      const int64_t x = a[bi];
      a.erase(a.begin() + static_cast<std::ptrdiff_t>(bi));
      b.push_back(x);
      load[hi] -= costs[x], load[lo] += costs[x];
      tok[hi] -= lengths[x], tok[lo] += lengths[x];
    } else {
      const int64_t x = a[bi], y = b[bk];
      a[bi] = y, b[bk] = x;
      load[hi] += costs[y] - costs[x], load[lo] += costs[x] - costs[y];
      tok[hi] += lengths[y] - lengths[x], tok[lo] += lengths[x] - lengths[y];
    }
  }
}

}  // namespace

void search_in_step(StepGrid& g, size_t s, const int64_t* lengths, const double* costs, int64_t capacity, bool moves,
                    int rounds) {
  const size_t dp = static_cast<size_t>(g.dp);
  std::vector<std::vector<int64_t>> parts(dp);
  std::vector<double> load(dp);
  std::vector<int64_t> tok(dp);
  for (size_t r = 0; r < dp; ++r)
    parts[r].swap(g.items[s * dp + r]), load[r] = g.load[s * dp + r], tok[r] = g.tok[s * dp + r];
  refine_step(parts, load, tok, lengths, costs, capacity, moves, rounds);
  for (size_t r = 0; r < dp; ++r)
    g.items[s * dp + r].swap(parts[r]), g.load[s * dp + r] = load[r], g.tok[s * dp + r] = tok[r];
}

}  // namespace packkit
