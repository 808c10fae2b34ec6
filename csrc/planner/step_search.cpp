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
  const double eps = 1e-12 * std::max(total, 1.0);
  std::vector<size_t> step_of(B);  // m / dp, looked up (integer division dominated the scans)
  for (size_t m = 0; m < B; ++m) step_of[m] = m / dp;
  // Each step's items costliest first (ties in by_cost's order: rank[item]), so a scan finds the swap partners of
  // an item in a step by a binary search and a window no wider than the step's largest slack allows.
  std::vector<int64_t> rank(n);
  for (size_t p = 0; p < n; ++p) rank[static_cast<size_t>(by_cost[p])] = static_cast<int64_t>(p);
  std::vector<std::vector<int64_t>> in_step(K);
  for (int64_t item : by_cost) in_step[step_of[static_cast<size_t>(where[static_cast<size_t>(item)])]].push_back(item);
  auto before = [&](int64_t a, int64_t b) { return rank[static_cast<size_t>(a)] < rank[static_cast<size_t>(b)]; };
  StepTops tops{std::vector<int64_t>(K), std::vector<double>(K), std::vector<double>(K)};
  std::vector<double> widest(K);  // the step's largest slack: its maximum minus its cheapest micro-batch
  auto update_step = [&](size_t t) {
    tops.update(g, t);
    double low = g.load[t * dp];
    for (size_t m = t * dp + 1; m < (t + 1) * dp; ++m) low = std::min(low, g.load[m]);
    widest[t] = tops.first[t] - low;
  };
  for (size_t t = 0; t < K; ++t) update_step(t);
  std::vector<size_t> order;
  order.reserve(K);

  // A step scanned without finding a change keeps none until it changes itself or a micro-batch of another step
  // changes: it is rescanned only against the steps changed since (epochs = changes made so far).
  std::vector<int64_t> changed_at(K, 0), scanned_at(K, -1);
  std::vector<size_t> targets;  // the steps a scan may take from / give to
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
    targets.clear();
    for (size_t t = 0; t < K; ++t)
      if (t != s && (whole || changed_at[t] > scanned_at[s])) targets.push_back(t);
    if (targets.empty()) return;
    double best = eps, best_shed = 0;
    // Changes of equal gain (a shed d anywhere in [lead, slack] gains exactly lead) prefer the one that sheds the
    // most, up to the step's mean: the step's top micro-batches then come down in few changes, not in many of one
    // lead each.
    double mean = 0;
    for (size_t m = s * dp; m < (s + 1) * dp; ++m) mean += g.load[m];
    const double above_mean = g.load[src] - mean / static_cast<double>(dp);
    auto better = [&](double net, double shed) {
      if (net > best) return true;
      return net == best && kind != 0 && shed > best_shed;
    };
    // A change that gains the whole lead and sheds at least half the way to the step's mean ends the scan: others
    // could only shed a little more.
    auto enough = [&]() { return kind != 0 && best >= lead && best_shed >= kEnoughShed * above_mean; };
    for (int64_t i : g.items[src]) {
      if (enough()) break;
      const double c = costs[i];
      const int64_t li = lengths[i];
      if (std::min(c, lead) < best) continue;  // no change of this item gains more than min(c, lead)
      for (size_t t : targets) {
        if (enough()) break;
        const double room = tops.first[t];
        // net = min(d, lead) - max(0, d - slack) > best needs slack > max(0, d - lead) + best: a step whose largest
        // slack is below that has no partner (nor, for d = c, a move target).
        if (moves && widest[t] > c - std::min(c, lead) + best) {
          for (size_t m = t * dp; m < (t + 1) * dp; ++m) {
            if (g.tok[m] + li > capacity) continue;
            const double slack = room - g.load[m];
            const double net = std::min(c, lead) - std::max(0.0, c - slack);
            const double shed = std::min({c, slack, above_mean});
            if (better(net, shed)) best = net, best_shed = shed, kind = 1, item = i, target = m;
          }
        }
        // swap partners j: d = c - c_j > best (the gain is <= d) and d < widest + lead - best
        const std::vector<int64_t>& pool = in_step[t];
        auto it = std::upper_bound(pool.begin(), pool.end(), c - best,
                                   [&](double x, int64_t j) { return x > costs[j]; });  // first c_j < c - best
        for (; it != pool.end(); ++it) {
          const int64_t j = *it;
          const double d = c - costs[j];
          if (d >= widest[t] + lead - best) break;
          const size_t m = static_cast<size_t>(where[static_cast<size_t>(j)]);
          const int64_t dl = li - lengths[j];
          if (g.tok[m] + dl > capacity || g.tok[src] - dl > capacity) continue;
          const double slack = room - g.load[m];
          const double net = std::min(d, lead) - std::max(0.0, d - slack);
          const double shed = std::min({d, slack, above_mean});
          if (better(net, shed)) best = net, best_shed = shed, kind = 2, item = i, partner = j, target = m;
        }
      }
    }
  };
  auto take = [&](size_t m, int64_t x) {
    auto& v = g.items[m];
    *std::find(v.begin(), v.end(), x) = v.back();
    v.pop_back();
    g.load[m] -= costs[x], g.tok[m] -= lengths[x];
    auto& pool = in_step[step_of[m]];
    pool.erase(std::lower_bound(pool.begin(), pool.end(), x, before));
  };
  auto put = [&](size_t m, int64_t x) {
    g.items[m].push_back(x);
    g.load[m] += costs[x], g.tok[m] += lengths[x];
    where[static_cast<size_t>(x)] = static_cast<int64_t>(m);
    auto& pool = in_step[step_of[m]];
    pool.insert(std::upper_bound(pool.begin(), pool.end(), x, before), x);
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
    const int64_t made_before = made;
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
      for (size_t t : {src / dp, target / dp}) update_step(t), changed[t] = 1, changed_at[t] = made;
    }
    if (made == made_before) break;
  }
  return made;
}

}  // namespace packkit
