// Dynamic CP planning (context_parallel_plan.hpp): sizes and the certified lower bound here, the builders
// (list scheduling without barrier, steps under the "pass" barrier) in context_parallel_build.cpp.
#include "context_parallel_plan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "context_parallel_internal.hpp"
#include "plan_types.hpp"

namespace packkit {
namespace cp_detail {

namespace {

// For each window width w in 1..W: max over windows of that width of the window's min value (the best a
// contiguous group of w ranks offers). O(W) with a monotonic stack: rank r is the min of windows up to the
// width between its nearest smaller neighbours.
template <typename T>
std::vector<T> best_window_min(const std::vector<T>& v) {
  const int64_t W = static_cast<int64_t>(v.size());
  std::vector<int64_t> left(W), right(W), stack;
  for (int64_t r = 0; r < W; ++r) {
    while (!stack.empty() && v[stack.back()] >= v[r]) stack.pop_back();
    left[r] = stack.empty() ? -1 : stack.back();
    stack.push_back(r);
  }
  stack.clear();
  for (int64_t r = W - 1; r >= 0; --r) {
    while (!stack.empty() && v[stack.back()] > v[r]) stack.pop_back();
    right[r] = stack.empty() ? W : stack.back();
    stack.push_back(r);
  }
  std::vector<T> best(W + 1, std::numeric_limits<T>::lowest());
  for (int64_t r = 0; r < W; ++r) best[right[r] - left[r] - 1] = std::max(best[right[r] - left[r] - 1], v[r]);
  for (int64_t w = W - 1; w >= 1; --w) best[w] = std::max(best[w], best[w + 1]);  // wider fits also narrower
  return best;
}

}  // namespace

std::pair<int64_t, double> Ctx::group(int64_t s, int64_t c) const {
  if (uniform) return {opts.caps[0], opts.speed[0]};
  if (opts.pow2 && c > 0 && (c & (c - 1)) == 0 && s % c == 0) {
    int64_t l = 0;
    while ((int64_t{1} << l) < c) ++l;
    return {level_cap[l][s >> l], level_speed[l][s >> l]};
  }
  int64_t cap = std::numeric_limits<int64_t>::max();
  double sp = std::numeric_limits<double>::infinity();
  for (int64_t r = s; r < s + c; ++r) cap = std::min(cap, opts.caps[r]), sp = std::min(sp, opts.speed[r]);
  return {cap, sp};
}

Ctx::Ctx(const int64_t* lengths, const double* costs, int64_t n_, const CpOptions& o)
    : L(lengths), C(costs), n(n_), opts(o), W(o.world) {
  // Allowed sizes and what the best group of each size offers (its smallest cap and slowest speed).
  if (opts.pow2) {
    level_cap.push_back(opts.caps);
    level_speed.push_back(opts.speed);
    for (int64_t c = 2; c <= W; c *= 2) {
      const auto& pc = level_cap.back();
      const auto& ps = level_speed.back();
      std::vector<int64_t> cap(static_cast<size_t>(W / c));
      std::vector<double> sp(cap.size());
      for (size_t j = 0; j < cap.size(); ++j) {
        cap[j] = std::min(pc[2 * j], pc[2 * j + 1]);
        sp[j] = std::min(ps[2 * j], ps[2 * j + 1]);
      }
      level_cap.push_back(std::move(cap));
      level_speed.push_back(std::move(sp));
    }
    for (int64_t c = 1, l = 0; c <= opts.max_cp; c *= 2, ++l) {
      if (c < opts.min_cp) continue;
      sizes.push_back(c);
      size_cap.push_back(*std::max_element(level_cap[l].begin(), level_cap[l].end()));
      size_speed.push_back(*std::max_element(level_speed[l].begin(), level_speed[l].end()));
    }
  } else {
    const auto cap_best = best_window_min(opts.caps);
    const auto speed_best = best_window_min(opts.speed);
    for (int64_t c = opts.min_cp; c <= opts.max_cp; ++c) {
      sizes.push_back(c);
      size_cap.push_back(cap_best[c]);
      size_speed.push_back(speed_best[c]);
    }
  }
  cap_max = *std::max_element(opts.caps.begin(), opts.caps.end());
  speed_min = *std::min_element(opts.speed.begin(), opts.speed.end());
  speed_sum = std::accumulate(opts.speed.begin(), opts.speed.end(), 0.0);
  uniform = std::all_of(opts.caps.begin(), opts.caps.end(), [&](int64_t v) { return v == opts.caps[0]; }) &&
            std::all_of(opts.speed.begin(), opts.speed.end(), [&](double v) { return v == opts.speed[0]; });

  // Smallest feasible size per sequence (index into `sizes`).
  min_size.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // A group of c ranks holds at most c * cap_max tokens, so no size below length / cap_max fits.
    const int64_t floor_c = std::max<int64_t>(1, L[i] / cap_max + (L[i] % cap_max != 0));
    size_t k = opts.pow2 ? 0 : static_cast<size_t>(std::max<int64_t>(0, floor_c - opts.min_cp));
    while (k < sizes.size() && cp_local_tokens(L[i], sizes[k]) > size_cap[k]) ++k;
    if (k >= sizes.size()) {
      // The size it needs on uniform caps of cap_max, whatever the world, in closed form (no loop sized by a
      // length): a zigzag shard holds 2 * ceil(len / 2c) tokens, so c > 1 needs c >= len / (2 * floor(cap / 2)),
      // and a cap below 2 holds no shard of a longer sequence at any size.
      const std::string where = "lengths[" + std::to_string(i) + "] = " + std::to_string(L[i]) +
                                " fits no allowed CP group at max_tokens_per_rank " + std::to_string(cap_max) +
                                " (world_size " + std::to_string(W) + ", CP sizes " + std::to_string(opts.min_cp) +
                                ".." + std::to_string(opts.max_cp) + (opts.pow2 ? ", powers of two)" : ")");
      const int64_t half = cap_max / 2;
      if (half == 0) throw InvalidInput(where + ": a shard at CP size > 1 holds at least 2 tokens");
      int64_t need = std::max<int64_t>(2, L[i] / (2 * half) + (L[i] % (2 * half) != 0));
      if (opts.pow2) {
        int64_t p = 2;
        while (p < need && p < (int64_t{1} << 62)) p *= 2;
        need = p;
      }
      need = std::max(need, opts.min_cp);
      throw InvalidInput(where + ": it needs a CP size of at least " + std::to_string(need));
    }
    min_size[i] = static_cast<int32_t>(k);
  }
  by_cost.resize(static_cast<size_t>(n));
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::sort(by_cost.begin(), by_cost.end(), [&](int64_t a, int64_t b) { return C[a] != C[b] ? C[a] > C[b] : a < b; });
}

double Ctx::t(int64_t i, int64_t c) const {
  if (c == 1) return C[i];
  return C[i] / static_cast<double>(c) +
         opts.cp_comm * static_cast<double>(c - 1) / static_cast<double>(c) * static_cast<double>(L[i]);
}

bool Ctx::fits(int64_t i, size_t k) const { return cp_local_tokens(L[i], sizes[k]) <= size_cap[k]; }

double Ctx::best_pass_time(int64_t i, size_t k) const { return opts.pass_overhead + t(i, sizes[k]) / size_speed[k]; }

// Certified lower bound on the makespan of every plan (derivation: docs/planner.md, "Dynamic context
// parallelism"). Three facts every plan obeys:
//  * rank-seconds: a pass of duration D on group g gives each rank r of g speed_r * D >= t-sum + speed_min * O
//    speed-weighted seconds, and c * t(s, c) = cost(s) + cp_comm * (c - 1) * s grows with c, so each sequence
//    takes at least c_min * t(s, c_min); the makespan M satisfies M * sum(speed) >= that total plus the
//    overhead of the rank-passes (each holds <= cap_max tokens and a sequence's shards hold >= s tokens);
//  * the pass holding sequence i lasts at least O + t(i, c) / (best speed of a size-c group) for its c;
//  * both at once for one sequence: its c fixes its pass time and its share of the rank-seconds.
double Ctx::lower_bound(bool barrier_term) const {
  if (n == 0) return 0.0;
  double work = 0.0;
  long double tokens = 0.0L;
  for (int64_t i = 0; i < n; ++i) {
    work += static_cast<double>(sizes[min_size[i]]) * t(i, sizes[min_size[i]]);
    tokens += static_cast<long double>(L[i]);
  }
  const double rank_passes = std::max(1.0L, std::ceil(tokens / static_cast<long double>(cap_max)));
  const double overhead = opts.pass_overhead * speed_min * rank_passes;
  double bound = (work + overhead) / speed_sum;
  // The joint term, for the sequences with the largest costs (any subset gives a valid bound; this keeps it
  // O(64 * sizes) for the any-size mode on wide worlds).
  std::vector<int64_t> top(static_cast<size_t>(n));
  std::iota(top.begin(), top.end(), 0);
  const size_t k_top = std::min<size_t>(top.size(), 64);
  std::partial_sort(top.begin(), top.begin() + k_top, top.end(), [&](int64_t a, int64_t b) {
    return C[a] != C[b] ? C[a] > C[b] : L[a] > L[b];
  });
  for (size_t q = 0; q < k_top; ++q) {
    const int64_t i = top[q];
    const double own = static_cast<double>(sizes[min_size[i]]) * t(i, sizes[min_size[i]]);
    double best = std::numeric_limits<double>::infinity();
    for (size_t k = min_size[i]; k < sizes.size(); ++k) {
      if (!fits(i, k)) continue;
      const double share = (work - own + static_cast<double>(sizes[k]) * t(i, sizes[k]) + overhead) / speed_sum;
      best = std::min(best, std::max(best_pass_time(i, k), share));
    }
    bound = std::max(bound, best);
  }
  // Every other sequence's pass: its fastest size (scanned for all when the sizes are few).
  if (sizes.size() <= 32) {
    for (int64_t i = 0; i < n; ++i) {
      double best = std::numeric_limits<double>::infinity();
      for (size_t k = min_size[i]; k < sizes.size(); ++k)
        if (fits(i, k)) best = std::min(best, best_pass_time(i, k));
      bound = std::max(bound, best);
    }
  }
  if (barrier_term) bound = std::max(bound, barrier_bound(top, k_top, work, rank_passes));
  return bound;
}

// Under the "pass" barrier (docs/planner.md): the step holding sequence i lasts at least P_i (its fastest pass),
// and in that step every rank runs one pass of at most its cap in local tokens, a sequence's shards holding at
// least its length: the sequence work done there is at most K = the most c_min * t(s, c_min) any set of sequences
// of at most sum(caps) tokens carries (a fractional knapsack by work per token). Every other step lasts at least
// its work / sum(speeds). So M >= P_i + (Wmin - min(K, S * P_i) + v_min * O * (R - W)+) / S, for every i.
double Ctx::barrier_bound(const std::vector<int64_t>& top, size_t k_top, double work, double rank_passes) const {
  std::vector<double> w(static_cast<size_t>(n)), density(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    w[i] = static_cast<double>(sizes[min_size[i]]) * t(i, sizes[min_size[i]]);
    density[i] = L[i] > 0 ? w[i] / static_cast<double>(L[i]) : 0.0;
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return density[a] > density[b]; });
  long double room = 0.0L, most = 0.0L;  // room: sum of caps; most: K
  for (int64_t c : opts.caps) room += static_cast<long double>(c);
  for (int64_t i : order) {
    if (L[i] == 0) {
      most += w[i];  // no tokens: always fits (a callable's cost for length 0)
      continue;
    }
    const long double take = std::min<long double>(room, static_cast<long double>(L[i]));
    most += take * static_cast<long double>(density[i]);
    room -= take;
    if (room <= 0) break;
  }
  const double others = opts.pass_overhead * speed_min * std::max(0.0, rank_passes - static_cast<double>(W));
  double bound = 0.0;
  for (size_t q = 0; q < k_top; ++q) {
    const int64_t i = top[q];
    double p = std::numeric_limits<double>::infinity();
    for (size_t k = min_size[i]; k < sizes.size(); ++k)
      if (fits(i, k)) p = std::min(p, best_pass_time(i, k));
    const double in_step = std::min(static_cast<double>(most), speed_sum * p);
    bound = std::max(bound, p + std::max(0.0, work - in_step + others) / speed_sum);
  }
  return bound;
}

// CP size index per sequence for a target pass time: the smallest feasible size whose best pass time is
// within the target (wider sizes cost more rank-seconds: c * t grows with c), else the fastest size.
std::vector<int32_t> Ctx::choose_sizes(double target) const {
  std::vector<int32_t> chosen(min_size);
  if (!std::isfinite(target)) return chosen;
  const double k_comm = opts.cp_comm;
  for (int64_t i = 0; i < n; ++i) {
    size_t k = min_size[i];
    if (best_pass_time(i, k) <= target) continue;
    // t(c) = k*s + (cost - k*s) / c: the smallest c reaching the target at the fastest speed is a floor.
    const double s = static_cast<double>(L[i]);
    const double room = (target - opts.pass_overhead) * size_speed[0] - k_comm * s;
    if (!opts.pow2 && room > 0 && C[i] > k_comm * s) {
      const double c_floor = std::ceil((C[i] - k_comm * s) / room);
      if (c_floor > static_cast<double>(sizes[k]))
        k = static_cast<size_t>(std::min<double>(c_floor - static_cast<double>(opts.min_cp),
                                                 static_cast<double>(sizes.size() - 1)));
    }
    size_t fastest = min_size[i];
    for (; k < sizes.size(); ++k) {
      if (!fits(i, k)) continue;
      if (best_pass_time(i, k) <= target) break;
      if (best_pass_time(i, k) < best_pass_time(i, fastest)) fastest = k;
    }
    if (k == sizes.size()) {
      // Out of reach: the narrowest size within 2% of the fastest (t(c) flattens towards cp_comm * s, so the
      // last doublings buy little time for many ranks).
      const double good_enough = best_pass_time(i, fastest) * 1.02;
      for (k = min_size[i]; k < fastest && !(fits(i, k) && best_pass_time(i, k) <= good_enough); ++k) {
      }
    }
    chosen[i] = static_cast<int32_t>(k);
  }
  return chosen;
}

}  // namespace cp_detail

CpPlan plan_context_parallel(const int64_t* lengths, const double* costs, int64_t n, const CpOptions& opts) {
  if (opts.world < 1 || static_cast<int64_t>(opts.caps.size()) != opts.world ||
      static_cast<int64_t>(opts.speed.size()) != opts.world)
    throw InvalidInput("plan_context_parallel: world, caps and speed disagree");
  if (opts.min_cp < 1 || opts.max_cp < opts.min_cp || opts.max_cp > opts.world)
    throw InvalidInput("plan_context_parallel: need 1 <= min_cp <= max_cp <= world");
  if (n > kMaxItems) throw InvalidInput("plan_context_parallel: at most 2^31 - 1 sequences");
  cp_detail::Ctx ctx(lengths, costs, n, opts);
  // The candidates' targets come from the barrier-free bound (the barrier term only certifies: with it as the
  // target scale, steps are planned shorter than they can be and planning takes 10x longer for the same plans).
  const double bound = ctx.lower_bound(false);
  // Candidate plans: CP sizes widened towards a few target pass times (multiples of the bound), each built
  // and simulated; the shortest makespan wins. Identical size choices are built once.
  // Under the "pass" barrier every step lasts its longest pass, so the targets go down to a step's length too.
  // 0: every sequence at about its fastest size (few sequences: running them one after another, each on many
  // ranks, beats running them side by side).
  std::vector<double> multipliers = {1.0, 1.03, 1.1, 1.25, 1.5, 2.0, 3.0, std::numeric_limits<double>::infinity(), 0.0};
  const std::vector<double> list_multipliers = multipliers;  // the barrier-free search's, for as_steps below
  if (opts.pass_barrier)
    for (double m = 0.5; m > 0.1; m *= 0.5) multipliers.push_back(m);
  int64_t candidates = 0;
  // Under the barrier, two more kinds of candidate (issue 63: the barrier plan was longer than plans these give):
  // `as_steps`, a barrier-free list plan laid out as steps (valid under the barrier: the one-step plan among
  // them), and `off`, ranks left idle at every step (one slow rank otherwise sets every step's length).
  std::vector<char> off;
  bool as_steps = false;
  CpPlan best_steps;
  best_steps.makespan = std::numeric_limits<double>::infinity();
  auto build = [&](const std::vector<int32_t>& chosen, int order) {
    ++candidates;
    if (!opts.pass_barrier) return cp_detail::build_list(ctx, chosen, order);
    if (as_steps) {  // searched as without barrier; every list plan built is a candidate laid out as steps
      CpPlan list = cp_detail::build_list(ctx, chosen, order);
      CpPlan steps = cp_detail::steps_of_list(ctx, list);
      if (steps.makespan < best_steps.makespan) best_steps = std::move(steps);
      return list;
    }
    return cp_detail::build_steps(ctx, chosen, order, off);
  };
  // One search per family of builder orders (under the barrier: without, then with short sequences joining wider
  // passes, order bit 2), each with its own critical-pass widening; the shorter wins. Separate, so a family that
  // helps most batches never makes one worse through the greedy widening that follows it.
  auto search = [&](int first_order, int end_order) {
    CpPlan best;
    best.makespan = std::numeric_limits<double>::infinity();
    std::vector<std::vector<int32_t>> tried;
    std::vector<int32_t> best_chosen;
    int best_order = first_order;
    for (double m : as_steps ? list_multipliers : multipliers) {
      auto chosen = ctx.choose_sizes(bound * m);
      if (std::find(tried.begin(), tried.end(), chosen) != tried.end()) continue;
      for (int order = first_order; order < end_order; ++order) {
        CpPlan plan = build(chosen, order);
        if (plan.makespan < best.makespan) best = std::move(plan), best_chosen = chosen, best_order = order;
      }
      tried.push_back(std::move(chosen));
    }
    // Critical-pass widening: the costliest sequence of the pass that ends last (under the barrier: the longest
    // pass) gets the next wider feasible size (about twice as wide), while that shortens the makespan. Targets
    // miss this where a wide sequence's successor waits for it (few sequences per rank).
    for (int round = 0; round < 8 && n > 0 && std::isfinite(best.makespan) && best.makespan > bound * 1.001;
         ++round) {
      size_t crit = 0;
      for (size_t p = 1; p < best.start.size(); ++p) {
        const bool steps = opts.pass_barrier && !as_steps;  // as_steps: the list plans' criterion
        const double end_p = steps ? best.duration[p] : best.start[p] + best.duration[p];
        const double end_c = steps ? best.duration[crit] : best.start[crit] + best.duration[crit];
        if (end_p > end_c) crit = p;
      }
      int64_t victim = -1;
      double victim_t = -1.0;
      for (int64_t q = best.offsets[crit]; q < best.offsets[crit + 1]; ++q) {
        const int64_t i = best.seqs[q];
        const double ti = ctx.t(i, ctx.sizes[best_chosen[i]]);
        if (ti > victim_t) victim = i, victim_t = ti;
      }
      if (victim < 0) break;
      const size_t cur = static_cast<size_t>(best_chosen[victim]);
      size_t k = cur + 1;
      while (k < ctx.sizes.size() && (ctx.sizes[k] < 2 * ctx.sizes[cur] || !ctx.fits(victim, k))) ++k;
      if (k == ctx.sizes.size()) break;
      auto chosen = best_chosen;
      chosen[victim] = static_cast<int32_t>(k);
      CpPlan plan = build(chosen, best_order);
      if (!(plan.makespan < best.makespan)) break;
      best = std::move(plan);
      best_chosen = std::move(chosen);
    }
    return best;
  };
  CpPlan best = search(0, opts.pass_barrier ? 4 : 2);
  if (opts.pass_barrier) {
    CpPlan joined = search(4, 8);
    if (joined.makespan < best.makespan) best = std::move(joined);
    as_steps = true;
    search(0, 2);  // fills best_steps
    if (best_steps.makespan < best.makespan) best = std::move(best_steps);
    as_steps = false;
    // The slowest ranks left idle: below each of the 3 lowest distinct speeds but the fastest.
    std::vector<double> speeds(opts.speed);
    std::sort(speeds.begin(), speeds.end());
    speeds.erase(std::unique(speeds.begin(), speeds.end()), speeds.end());
    for (size_t k = 1; k < speeds.size() && k <= 3; ++k) {
      off.assign(static_cast<size_t>(opts.world), 0);
      for (int64_t r = 0; r < opts.world; ++r) off[r] = opts.speed[r] < speeds[k];
      for (int first : {0, 4}) {
        CpPlan idle = search(first, first + 4);
        if (idle.makespan < best.makespan) best = std::move(idle);
      }
    }
    off.clear();
  }
  best.lower_bound = opts.pass_barrier ? std::max(bound, ctx.lower_bound(true)) : bound;
  best.candidates = candidates;
  if (opts.pass_barrier) cp_detail::add_idle_passes(ctx, best);
  return best;
}

}  // namespace packkit
