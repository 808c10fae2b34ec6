#include "step_search.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace packkit {
namespace {

constexpr double kEnoughShed = 0.5;  // see `enough` in search_across_steps

// Each step's costliest micro-batch (ties to the lower rank) and its two largest loads.
struct StepTops {
  std::vector<int64_t> top;
  std::vector<double> first, second;

  void update(const StepGrid& g, size_t s) {
    const size_t dp = static_cast<size_t>(g.dp);
    size_t hi = s * dp;
    double a = g.load[hi], b = -std::numeric_limits<double>::infinity();
    for (size_t m = s * dp + 1; m < (s + 1) * dp; ++m) {
      const double x = g.load[m];
      if (x > a) b = a, a = x, hi = m;
      else if (x > b) b = x;
    }
    top[s] = static_cast<int64_t>(hi), first[s] = a, second[s] = b;
  }
};

}  // namespace

double step_balance(const StepGrid& g) {
  const size_t dp = static_cast<size_t>(g.dp);
  const size_t K = dp ? g.load.size() / dp : 0;
  double sum_max = 0, total = 0;
  for (size_t s = 0; s < K; ++s) {
    double mx = g.load[s * dp];
    for (size_t m = s * dp; m < (s + 1) * dp; ++m) mx = std::max(mx, g.load[m]), total += g.load[m];
    sum_max += mx;
  }
  return total > 0 ? sum_max * static_cast<double>(dp) / total : 1.0;
}

int64_t search_across_steps(StepGrid& g, const int64_t* lengths, const double* costs, int64_t capacity,
                            const std::vector<int64_t>& by_cost, bool moves, int64_t max_rounds,
                            std::vector<char>& changed) {
  const size_t dp = static_cast<size_t>(g.dp);
  const size_t B = g.load.size();
  const size_t K = dp ? B / dp : 0;
  changed.assign(K, 0);
  if (dp < 2 || K < 2) return 0;
  const size_t n = by_cost.size();
  std::vector<int64_t> where(n);  // micro-batch of each item
  double total = 0;
  for (size_t m = 0; m < B; ++m) {
    total += g.load[m];
    for (int64_t item : g.items[m]) where[static_cast<size_t>(item)] = static_cast<int64_t>(m);
  }
  std::vector<double> sorted_cost(n);  // descending
  for (size_t p = 0; p < n; ++p) sorted_cost[p] = costs[by_cost[p]];
  const double eps = 1e-12 * std::max(total, 1.0);
  StepTops tops{std::vector<int64_t>(K), std::vector<double>(K), std::vector<double>(K)};
  for (size_t s = 0; s < K; ++s) tops.update(g, s);
  std::vector<size_t> order;
  order.reserve(K);
  std::vector<double> slack(B);  // room under the step's maximum
  std::vector<size_t> step_of(B);  // m / dp, looked up (integer division dominated the scans)
  for (size_t m = 0; m < B; ++m) step_of[m] = m / dp;
  // The micro-batches of most slack (about 2 * dp, where long items lead their steps) are scanned item by item;
  // every other one has slack <= tau, so its swap partners lie in a narrow cost window of by_cost, and only wide
  // ones can take a move of an item costlier than tau + lead. Kept true incrementally: a micro-batch whose slack
  // rises above tau joins the wide list; the list is re-ranked when it grows past 4 * dp.
  std::vector<double> ranked(B);
  std::vector<char> is_wide(B);
  std::vector<size_t> wide;
  double tau = 0;

  auto rank_wide = [&]() {
    for (size_t m = 0; m < B; ++m) slack[m] = tops.first[step_of[m]] - g.load[m];
    tau = 0;
    const size_t wide_count = std::min(B, 2 * dp);
    if (wide_count < B) {  // tau = the (wide_count + 1)-th largest slack
      std::copy(slack.begin(), slack.end(), ranked.begin());
      std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(wide_count), ranked.end(),
                       std::greater<double>());
      tau = std::max(0.0, ranked[wide_count]);
    }
    wide.clear();
    for (size_t m = 0; m < B; ++m) {
      is_wide[m] = slack[m] > tau;
      if (is_wide[m]) wide.push_back(m);
    }
  };
  rank_wide();

  // A step scanned without finding a change keeps none until it changes itself or a micro-batch of another step
  // changes: it is rescanned only against the steps changed since (epochs = changes made so far).
  std::vector<int64_t> changed_at(K, 0), scanned_at(K, -1);
  std::vector<char> allowed(K);  // steps whose micro-batches this scan may take from / give to
  std::vector<size_t> few;       // the allowed steps, when there are at most kFew of them
  constexpr size_t kFew = 4;
  int64_t made = 0;
  // One scan of step s: the best change of its costliest micro-batch; kind 1 = move item to micro-batch target,
  // 2 = swap item with partner (in target); 0 = none.
  int kind = 0;
  int64_t item = -1, partner = -1;
  size_t src = 0, target = 0;
  auto scan = [&](size_t s) {
    kind = 0;
    src = static_cast<size_t>(tops.top[s]);
    const double lead = tops.first[s] - tops.second[s];  // how far the step's maximum can fall
    const bool whole = scanned_at[s] < changed_at[s];
    few.clear();
    for (size_t t = 0; t < K; ++t) {
      allowed[t] = t != s && (whole || changed_at[t] > scanned_at[s]);
      if (allowed[t] && few.size() <= kFew) few.push_back(t);
    }
    if (few.empty()) return;
    double best = eps, best_shed = 0;
    // Changes of equal gain (a shed d anywhere in [lead, slack] gains exactly lead) prefer the one that sheds the
    // most, up to the step's mean: the step's top micro-batches then come down in few changes, not in many of one
    // lead each.
    double mean = 0;
    for (size_t m = s * dp; m < (s + 1) * dp; ++m) mean += g.load[m];
    const double above_mean = g.load[src] - mean / static_cast<double>(dp);
    auto better = [&](double net, double d, size_t m) {
      if (net > best) return true;
      return net == best && kind != 0 && std::min({d, slack[m], above_mean}) > best_shed;
    };
    // A change that gains the whole lead and sheds at least half the way to the step's mean ends the scan: others
    // could only shed a little more.
    auto enough = [&]() { return kind != 0 && best >= lead && best_shed >= kEnoughShed * above_mean; };
    auto consider_move = [&](int64_t i, double c, int64_t li, size_t m) {
      if (g.tok[m] + li > capacity) return;
      const double net = std::min(c, lead) - std::max(0.0, c - slack[m]);
      if (better(net, c, m))
        best = net, best_shed = std::min({c, slack[m], above_mean}), kind = 1, item = i, target = m;
    };
    auto consider_swap = [&](int64_t i, double c, int64_t li, int64_t j, size_t m) {
      const double d = c - costs[j];
      if (d < best) return;  // gain <= d
      const int64_t dl = li - lengths[j];
      if (g.tok[m] + dl > capacity || g.tok[src] - dl > capacity) return;
      const double net = std::min(d, lead) - std::max(0.0, d - slack[m]);
      if (better(net, d, m))
        best = net, best_shed = std::min({d, slack[m], above_mean}), kind = 2, item = i, partner = j, target = m;
    };
    for (int64_t i : g.items[src]) {
      if (enough()) break;
      const double c = costs[i];
      const int64_t li = lengths[i];
      if (std::min(c, lead) < best) continue;  // no change of this item gains more than min(c, lead)
      if (few.size() <= kFew) {  // a rescan against a few changed steps: their micro-batches item by item
        for (size_t t : few)
          for (size_t m = t * dp; m < (t + 1) * dp; ++m) {
            if (moves) consider_move(i, c, li, m);
            for (int64_t j : g.items[m]) consider_swap(i, c, li, j, m);
          }
        continue;
      }
      if (moves) {  // a move gains only into slack > c - lead + best: the wide micro-batches first
        for (size_t m : wide)
          if (allowed[step_of[m]]) consider_move(i, c, li, m);
        // the rest only if they can gain more (slack > c - lead + best), unless a move already gains and sheds all
        // this item can (min(c, lead), min(c, above_mean)): others would only tie
        const bool full = kind == 1 && item == i && best >= std::min(c, lead) &&
                          best_shed >= std::min(c, above_mean);
        if (c - lead + best < tau && !full)
          for (size_t m = 0; m < B; ++m)
            if (allowed[step_of[m]] && !is_wide[m]) consider_move(i, c, li, m);
      }
      for (size_t m : wide)
        if (allowed[step_of[m]] && !enough())
          for (int64_t j : g.items[m]) consider_swap(i, c, li, j, m);
      // Other swap partners j: d = c - c_j > best (the gain is <= d) and d < tau + lead - best (beyond it the rise
      // of j's step, d - slack >= d - tau, outweighs any gain): a window of by_cost.
      size_t p = static_cast<size_t>(
          std::upper_bound(sorted_cost.begin(), sorted_cost.end(), c - best, std::greater<double>()) -
          sorted_cost.begin());
      for (; p < n && c - sorted_cost[p] < tau + lead - best && !enough(); ++p) {
        const int64_t j = by_cost[p];
        const size_t m = static_cast<size_t>(where[static_cast<size_t>(j)]);
        if (allowed[step_of[m]] && !is_wide[m]) consider_swap(i, c, li, j, m);
      }
    }
  };
  auto take = [&](size_t m, int64_t x) {
    auto& v = g.items[m];
    *std::find(v.begin(), v.end(), x) = v.back();
    v.pop_back();
    g.load[m] -= costs[x], g.tok[m] -= lengths[x];
  };
  auto put = [&](size_t m, int64_t x) {
    g.items[m].push_back(x);
    g.load[m] += costs[x], g.tok[m] += lengths[x];
    where[static_cast<size_t>(x)] = static_cast<int64_t>(m);
  };
  // Sweeps: the steps by lead (largest first), each scanned once and its best change applied at once; until a
  // sweep changes nothing or max_rounds changes are made.
  while (made < max_rounds) {
    order.clear();
    for (size_t s = 0; s < K; ++s)
      if (tops.first[s] - tops.second[s] > eps) order.push_back(s);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return tops.first[a] - tops.second[a] > tops.first[b] - tops.second[b];
    });
    const int64_t before = made;
    for (size_t s : order) {
      if (made >= max_rounds) break;
      if (tops.first[s] - tops.second[s] <= eps) continue;  // an earlier change of this sweep tied its top two
      scan(s);
      if (!kind) {
        scanned_at[s] = made;
        continue;
      }
      take(src, item);
      if (kind == 2) take(target, partner), put(src, partner);
      put(target, item);
      ++made;
      for (size_t t : {src / dp, target / dp}) {
        tops.update(g, t);
        changed[t] = 1;
        changed_at[t] = made;
        for (size_t m = t * dp; m < (t + 1) * dp; ++m) {
          slack[m] = tops.first[t] - g.load[m];
          if (slack[m] > tau && !is_wide[m]) is_wide[m] = 1, wide.push_back(m);
        }
      }
      if (wide.size() > 4 * dp) rank_wide();  // the changes widened the list: rank it again
    }
    if (made == before) break;
  }
  return made;
}

}  // namespace packkit
