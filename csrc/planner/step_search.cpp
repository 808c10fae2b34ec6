#include "step_search.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
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
                            std::vector<char>& changed, double goal_sum) {
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
  double sum_max = 0;  // sum of the step maxima, kept with them (the goal test)
  auto update_step = [&](size_t t) {
    sum_max -= tops.first[t];
    tops.update(g, t);
    sum_max += tops.first[t];
    double low = g.load[t * dp];
    for (size_t m = t * dp + 1; m < (t + 1) * dp; ++m) low = std::min(low, g.load[m]);
    widest[t] = tops.first[t] - low;
  };
  for (size_t t = 0; t < K; ++t) update_step(t);
  if (sum_max <= goal_sum) return 0;
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
      if (sum_max <= goal_sum) return made;
    }
    if (made == made_before) break;
  }
  return made;
}

// Costs a*l + b*l^2 fitted from the shortest and the longest item with a length, then checked on every item.
static bool quadratic_cost(const int64_t* lengths, const double* costs, int64_t n, double& a, double& b) {
  int64_t lo = -1, hi = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (lengths[i] <= 0) continue;
    if (lo < 0 || lengths[i] < lengths[lo]) lo = i;
    if (hi < 0 || lengths[i] > lengths[hi]) hi = i;
  }
  if (lo < 0) return false;
  const double l1 = static_cast<double>(lengths[lo]), l2 = static_cast<double>(lengths[hi]);
  b = l2 > l1 ? (costs[hi] / l2 - costs[lo] / l1) / (l2 - l1) : 0.0;
  a = costs[lo] / l1 - b * l1;
  const double tol = 1e-9;
  if (a < -tol * std::fabs(costs[lo] / l1)) a = 0;  // rounding of an exact zero
  if (b < -tol * std::fabs(costs[hi] / (l2 * l2))) b = 0;
  if (a < 0 || b < 0 || a + b <= 0) return false;
  for (int64_t i = 0; i < n; ++i) {
    const double l = static_cast<double>(lengths[i]), c = a * l + b * l * l;
    if (std::fabs(c - costs[i]) > tol * std::max(c, costs[i])) return false;  // zero length: cost 0 only
  }
  return true;
}

double step_balance_bound(const int64_t* lengths, const double* costs, int64_t n, int64_t capacity, int64_t dp,
                          int64_t K) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double a = 0, b = 0;
  if (dp <= 1 || K <= 0 || !quadratic_cost(lengths, costs, n, a, b)) return nan;
  auto cost = [&](double x) { return a * x + b * x * x; };
  const double cap = static_cast<double>(capacity);
  double total = 0, longest_small = 0, longest = 0;
  std::vector<double> big;  // items longer than capacity / 2: never two in one micro-batch
  for (int64_t i = 0; i < n; ++i) {
    if (lengths[i] <= 0) continue;
    const double l = static_cast<double>(lengths[i]);
    total += cost(l), longest = std::max(longest, l);
    if (2 * lengths[i] > capacity) big.push_back(l);
    else longest_small = std::max(longest_small, l);
  }
  const size_t rows = static_cast<size_t>(K * dp), udp = static_cast<size_t>(dp), uK = static_cast<size_t>(K);
  if (total <= 0 || big.size() > rows) return nan;
  std::sort(big.begin(), big.end(), std::greater<double>());
  double small_cap = 0;  // the costliest micro-batch without a big item: q longest small items + the rest
  if (longest_small > 0) {
    const double q = std::floor(cap / longest_small);
    small_cap = q * cost(longest_small) + cost(cap - q * longest_small);
  }
  std::vector<double> caps(rows, small_cap);  // per-micro-batch cost caps, descending, K groups of dp
  for (size_t j = 0; j < big.size(); ++j) caps[j] = cost(big[j]) + cost(cap - big[j]);
  std::sort(caps.begin(), caps.end(), std::greater<double>());
  std::vector<double> leader(uK, 0.0);
  for (size_t k = 0; k * udp < big.size(); ++k) leader[k] = cost(big[k * udp]);
  if (big.empty()) leader[0] = cost(longest);
  double covered = 0, bound = 0;
  for (size_t k = 0; k < uK; ++k) {
    bound += leader[k];
    for (size_t r = 0; r < udp; ++r) covered += std::min(caps[k * udp + r], leader[k]);
  }
  double need = total - covered;
  if (need > 0) {  // raise leaders on the steepest segments first (slope r + 1 for row r of a group)
    double acc = 0, widths = 0;
    bool met = false;
    for (size_t r = udp; r-- > 0 && !met;) {
      for (size_t k = 0; k < uK; ++k) {
        const double below = r + 1 < udp ? caps[k * udp + r + 1] : -std::numeric_limits<double>::infinity();
        const double w = std::max(0.0, caps[k * udp + r] - std::max(below, leader[k]));
        const double slope = static_cast<double>(r + 1);
        if (acc + w * slope >= need) {
          bound += widths + (need - acc) / slope;
          met = true;
          break;
        }
        acc += w * slope, widths += w;
      }
    }
    if (!met) return nan;  // the items do not fit in K steps
  }
  return std::max(1.0, bound / (total / static_cast<double>(dp)) * (1 - 1e-12));
}

}  // namespace packkit
