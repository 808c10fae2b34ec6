// The two plan builders of dynamic CP (context_parallel_plan.hpp): list scheduling without barrier and
// steps under the "pass" barrier. Both only ever append sequences to passes, so each is O(n log n) plus the
// group scans (O(W / c) per wide sequence for aligned blocks, O(W) for blocks of any size).
#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "context_parallel_internal.hpp"

namespace packkit {
namespace cp_detail {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A scratch array of n values, all `init` (the state every builder leaves it in).
template <typename T>
std::vector<T>& ready(std::vector<T>& v, int64_t n, T init) {
  if (static_cast<int64_t>(v.size()) != n) v.assign(static_cast<size_t>(n), init);
  return v;
}

// One per pow2 level, sized like the level's blocks.
template <typename T>
std::vector<std::vector<T>>& ready_levels(std::vector<std::vector<T>>& v, const Ctx& x, T init) {
  if (v.size() != x.level_cap.size()) {
    v.clear();
    for (const auto& lc : x.level_cap) v.emplace_back(lc.size(), init);
  }
  return v;
}

// Sets the aligned blocks of every level that [s, s + c) overlaps to f(old value).
template <typename T, typename F>
void for_blocks(std::vector<std::vector<T>>& levels, int64_t s, int64_t c, F f) {
  for (size_t l = 0; l < levels.size(); ++l) {
    auto& lv = levels[l];
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(lv.size()) - 1, (s + c - 1) >> l);
    for (int64_t j = s >> l; j <= hi; ++j) lv[j] = f(lv[j]);
  }
}

// Passes under construction: the group, the tokens per rank, the summed t of its sequences.
struct Passes {
  double overhead = 0.0;
  std::vector<int64_t> start, size, tokens, cap, step;
  std::vector<double> work, speed, begin;
  std::vector<char> closed;             // a later pass shares one of its ranks: nothing can join it
  std::vector<int32_t> seq_pass;

  explicit Passes(int64_t n, double o) : overhead(o), seq_pass(static_cast<size_t>(n), -1) {}
  double duration(int64_t p) const { return overhead + work[p] / speed[p]; }
  int64_t open(int64_t s, int64_t c, int64_t cp, double sp, double b, int64_t st = 0) {
    start.push_back(s); size.push_back(c); tokens.push_back(0); cap.push_back(cp); step.push_back(st);
    work.push_back(0.0); speed.push_back(sp); begin.push_back(b); closed.push_back(0);
    return static_cast<int64_t>(start.size()) - 1;
  }
  void add(int64_t p, int64_t i, int64_t tok, double t) {
    tokens[p] += tok;
    work[p] += t;
    seq_pass[i] = static_cast<int32_t>(p);
  }
};

// Passes -> CpPlan: CSR of each pass's sequences (by index), and the makespan re-simulated from the list.
CpPlan finish(const Ctx& x, const std::vector<int32_t>& chosen, Passes& ps, bool barrier) {
  CpPlan out;
  const size_t P = ps.start.size();
  out.offsets.assign(P + 1, 0);
  for (int64_t i = 0; i < x.n; ++i) ++out.offsets[ps.seq_pass[i] + 1];
  for (size_t p = 0; p < P; ++p) out.offsets[p + 1] += out.offsets[p];
  out.seqs.resize(static_cast<size_t>(x.n));
  std::vector<int64_t> fill(out.offsets.begin(), out.offsets.end() - 1);
  for (int64_t i = 0; i < x.n; ++i) out.seqs[fill[ps.seq_pass[i]]++] = i;
  out.cp_size.resize(static_cast<size_t>(x.n));
  (void)chosen;
  for (int64_t i = 0; i < x.n; ++i) out.cp_size[i] = ps.size[ps.seq_pass[i]];
  out.duration.resize(P);
  out.start.resize(P);
  for (size_t p = 0; p < P; ++p) out.duration[p] = ps.duration(static_cast<int64_t>(p));
  if (barrier) {  // steps run back to back; each lasts its longest pass
    std::vector<double> step_len;
    for (size_t p = 0; p < P; ++p) {
      if (ps.step[p] >= static_cast<int64_t>(step_len.size())) step_len.resize(ps.step[p] + 1, 0.0);
      step_len[ps.step[p]] = std::max(step_len[ps.step[p]], out.duration[p]);
    }
    std::vector<double> step_begin(step_len.size() + 1, 0.0);
    for (size_t s = 0; s < step_len.size(); ++s) step_begin[s + 1] = step_begin[s] + step_len[s];
    for (size_t p = 0; p < P; ++p) out.start[p] = step_begin[ps.step[p]];
    out.makespan = step_begin.back();
    out.num_steps = static_cast<int64_t>(step_len.size());
  } else {  // each pass starts when all its ranks are free
    auto& free = ready(x.scratch.free, x.W, 0.0);
    double makespan = 0.0;
    for (size_t p = 0; p < P; ++p) {
      double b = 0.0;
      for (int64_t r = ps.start[p]; r < ps.start[p] + ps.size[p]; ++r) b = std::max(b, free[r]);
      out.start[p] = b;
      const double e = b + out.duration[p];
      for (int64_t r = ps.start[p]; r < ps.start[p] + ps.size[p]; ++r) free[r] = e;
      makespan = std::max(makespan, e);
    }
    for (size_t p = 0; p < P; ++p)
      std::fill(free.begin() + ps.start[p], free.begin() + ps.start[p] + ps.size[p], 0.0);
    out.makespan = makespan;
  }
  out.rank_start = std::move(ps.start);
  out.group_size = std::move(ps.size);
  out.local_tokens = std::move(ps.tokens);
  out.step = std::move(ps.step);
  return out;
}

// Sequence order: widest first then longest (order 0), or longest pass first (order 1); ties by index.
std::vector<int64_t> sorted_items(const Ctx& x, const std::vector<int32_t>& chosen, std::vector<int64_t> items,
                                  int order) {
  std::vector<double> key(static_cast<size_t>(x.n), 0.0);
  for (int64_t i : items) key[i] = x.t(i, x.sizes[chosen[i]]) / x.size_speed[chosen[i]];
  std::sort(items.begin(), items.end(), [&](int64_t a, int64_t b) {
    if (order == 0 && chosen[a] != chosen[b]) return chosen[a] > chosen[b];
    if (key[a] != key[b]) return key[a] > key[b];
    return a < b;
  });
  return items;
}

}  // namespace

CpPlan build_list(const Ctx& x, const std::vector<int32_t>& chosen, int order) {
  const double O = x.opts.pass_overhead;
  const auto& caps = x.opts.caps;
  const auto& speed = x.opts.speed;
  Passes ps(x.n, O);
  Scratch& sc = x.scratch;
  auto& free = ready(sc.free, x.W, 0.0);
  auto& last = ready(sc.last, x.W, int64_t{-1});
  auto& mark = ready(sc.mark, x.W, char{0});  // uniform ranks: written by some pass
  // pow2: the latest free time in each aligned block, per level (free times only grow, so a max suffices).
  std::vector<std::vector<double>> no_levels;
  auto& level_free = x.opts.pow2 ? ready_levels(sc.level_free, x, 0.0) : no_levels;
  auto occupy = [&](int64_t p, double end) {  // the pass's ranks are busy until `end`
    const int64_t s = ps.start[p], c = ps.size[p];
    sc.ranges.emplace_back(s, c);
    for (int64_t r = s; r < s + c; ++r) {
      if (last[r] >= 0 && last[r] != p) ps.closed[last[r]] = 1;
      last[r] = p;
      free[r] = end;
      mark[r] = 1;
    }
    for_blocks(level_free, s, c, [end](double v) { return std::max(v, end); });
  };
  auto reset = [&] {  // the scratch as it was found
    for (const auto& [s, c] : sc.ranges) {
      std::fill(free.begin() + s, free.begin() + s + c, 0.0);
      std::fill(last.begin() + s, last.begin() + s + c, int64_t{-1});
      std::fill(mark.begin() + s, mark.begin() + s + c, char{0});
      for_blocks(level_free, s, c, [](double) { return 0.0; });
    }
    sc.ranges.clear();
  };
  auto can_join = [&](int64_t p, int64_t s, int64_t c, int64_t tok) {
    return p >= 0 && !ps.closed[p] && ps.start[p] == s && ps.size[p] == c && tok <= ps.cap[p] - ps.tokens[p];
  };

  // Narrow sequences in the once-sorted cost order (their key, cost / speed, orders them alike): no sort per
  // candidate for the many short ones.
  std::vector<int64_t> wide, narrow;
  for (int64_t i : x.by_cost) (x.sizes[chosen[i]] > 1 ? wide : narrow).push_back(i);

  // Wide sequences, in order, each onto the group of its size where it finishes first (joining the group's
  // open pass when its tokens fit: one overhead less).
  std::deque<int64_t> qmax, qcap, qspeed;  // sliding windows for blocks of any size
  for (int64_t i : sorted_items(x, chosen, wide, order)) {
    const int64_t c = x.sizes[chosen[i]], tok = cp_local_tokens(x.L[i], c);
    const double ti = x.t(i, c);
    double best_fin = kInf, best_begin = 0.0, best_speed = 1.0;
    int64_t best_s = -1, best_cap = 0;
    bool best_join = false;
    auto consider = [&](int64_t s, double begin, int64_t bcap, double bspeed) {
      const int64_t p = last[s];
      if (can_join(p, s, c, tok)) {
        const double fin = ps.begin[p] + ps.duration(p) + ti / ps.speed[p];
        if (fin < best_fin) best_fin = fin, best_s = s, best_join = true;
      } else if (tok <= bcap) {
        const double fin = begin + O + ti / bspeed;
        if (fin < best_fin) best_fin = fin, best_s = s, best_join = false, best_begin = begin, best_cap = bcap,
                            best_speed = bspeed;
      }
    };
    if (x.opts.pow2) {
      int64_t l = 0;
      while ((int64_t{1} << l) < c) ++l;
      for (size_t j = 0; j < level_free[l].size(); ++j)
        consider(static_cast<int64_t>(j) * c, level_free[l][j], x.level_cap[l][j], x.level_speed[l][j]);
    } else {
      qmax.clear(), qcap.clear(), qspeed.clear();
      for (int64_t r = 0; r < x.W; ++r) {
        while (!qmax.empty() && free[qmax.back()] <= free[r]) qmax.pop_back();
        while (!qcap.empty() && caps[qcap.back()] >= caps[r]) qcap.pop_back();
        while (!qspeed.empty() && speed[qspeed.back()] >= speed[r]) qspeed.pop_back();
        qmax.push_back(r), qcap.push_back(r), qspeed.push_back(r);
        const int64_t s = r - c + 1;
        if (s < 0) continue;
        while (qmax.front() < s) qmax.pop_front();
        while (qcap.front() < s) qcap.pop_front();
        while (qspeed.front() < s) qspeed.pop_front();
        consider(s, free[qmax.front()], caps[qcap.front()], speed[qspeed.front()]);
      }
    }
    if (best_s < 0) throw std::logic_error("plan_context_parallel: no group holds a feasible sequence");
    const int64_t p = best_join ? last[best_s] : ps.open(best_s, c, best_cap, best_speed, best_begin);
    ps.add(p, i, tok, ti);
    occupy(p, ps.begin[p] + ps.duration(p));
  }

  // Narrow sequences (c = 1), longest first, onto the rank where each finishes first: one heap of free times
  // per (speed, cap) class, each class's earliest rank a candidate. Uniform ranks: one class, whose ranks no pass
  // has touched (free at 0, taken in index order) come from `fresh` instead of a W-entry heap.
  using Entry = std::pair<double, int64_t>;
  using Heap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  std::vector<Heap> heaps;
  int64_t fresh = x.W;
  if (x.uniform) {
    heaps.resize(1);
    for (const auto& [s, c] : sc.ranges)
      for (int64_t r = s; r < s + c; ++r)
        if (mark[r] == 1) heaps[0].emplace(free[r], r), mark[r] = 2;  // each touched rank once
    fresh = 0;
    while (fresh < x.W && mark[fresh]) ++fresh;
  } else {
    std::map<std::pair<double, int64_t>, int> class_id;
    std::vector<int> rank_class(static_cast<size_t>(x.W));
    for (int64_t r = 0; r < x.W; ++r)
      rank_class[r] = class_id.emplace(std::make_pair(speed[r], caps[r]), static_cast<int>(class_id.size()))
                          .first->second;
    heaps.resize(class_id.size());
    for (int64_t r = 0; r < x.W; ++r) heaps[rank_class[r]].emplace(free[r], r);
  }
  auto top = [&](size_t q) -> Entry {  // the class's earliest rank (uniform: a fresh one or the heap's)
    if (fresh < x.W && (heaps[q].empty() || Entry(0.0, fresh) < heaps[q].top())) return {0.0, fresh};
    return heaps[q].top();
  };
  auto pop = [&](size_t q, int64_t r) {
    if (r == fresh && fresh < x.W) {
      mark[fresh] = 2;
      while (fresh < x.W && mark[fresh]) ++fresh;
    } else {
      heaps[q].pop();
    }
  };
  // Sequences without tokens or cost join any pass (at its group's size: 0 local tokens) and open none.
  int64_t any_pass = ps.start.empty() ? -1 : 0;
  for (int64_t i : narrow) {
    const int64_t tok = x.L[i];
    const double ti = x.C[i];
    if (tok == 0 && ti == 0.0 && any_pass >= 0) {
      ps.add(any_pass, i, 0, 0.0);
      continue;
    }
    double best_fin = kInf;
    int best_q = -1;
    for (size_t q = 0; q < heaps.size(); ++q) {
      const int64_t r = top(q).second;
      if (caps[r] < tok) continue;
      const double fin = free[r] + (can_join(last[r], r, 1, tok) ? 0.0 : O) + ti / speed[r];
      if (fin < best_fin) best_fin = fin, best_q = static_cast<int>(q);
    }
    if (best_q < 0) throw std::logic_error("plan_context_parallel: no rank holds a feasible sequence");
    const int64_t r = top(best_q).second;
    pop(best_q, r);
    const int64_t p = can_join(last[r], r, 1, tok) ? last[r] : ps.open(r, 1, caps[r], speed[r], free[r]);
    ps.add(p, i, tok, ti);
    occupy(p, ps.begin[p] + ps.duration(p));
    mark[r] = 2;
    heaps[best_q].emplace(free[r], r);
    any_pass = p;
  }
  reset();
  return finish(x, chosen, ps, false);
}

CpPlan steps_of_list(const Ctx& x, const CpPlan& list) {
  const int64_t W = x.W;
  const size_t P = list.rank_start.size();
  auto& next = ready(x.scratch.next, W, int64_t{0});
  std::vector<int64_t> step(P);
  int64_t S = 0;
  for (size_t p = 0; p < P; ++p) {
    const int64_t s0 = list.rank_start[p], c = list.group_size[p];
    int64_t s = 0;
    for (int64_t r = s0; r < s0 + c; ++r) s = std::max(s, next[r]);
    for (int64_t r = s0; r < s0 + c; ++r) next[r] = s + 1;
    step[p] = s;
    S = std::max(S, s + 1);
  }
  for (size_t p = 0; p < P; ++p)
    std::fill(next.begin() + list.rank_start[p], next.begin() + list.rank_start[p] + list.group_size[p], 0);
  std::vector<size_t> order(P);
  for (size_t p = 0; p < P; ++p) order[p] = p;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return step[a] < step[b]; });
  Passes ps(x.n, x.opts.pass_overhead);
  size_t q = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (; q < P && step[order[q]] == s; ++q) {
      const size_t p = order[q];
      const int64_t s0 = list.rank_start[p], c = list.group_size[p];
      if (list.offsets[p] == list.offsets[p + 1]) continue;  // the list's own empty passes: re-made below
      const auto [cap, sp] = x.group(s0, c);
      const int64_t np = ps.open(s0, c, cap, sp, 0.0, s);
      for (int64_t k = list.offsets[p]; k < list.offsets[p + 1]; ++k) {
        const int64_t i = list.seqs[k];
        const int64_t tok = x.L[i] == 0 && x.C[i] == 0.0 ? 0 : cp_local_tokens(x.L[i], c);
        ps.add(np, i, tok, x.L[i] == 0 && x.C[i] == 0.0 ? 0.0 : x.t(i, c));
      }
    }
  }
  return finish(x, {}, ps, true);  // idle ranks: add_idle_passes, for the plan that wins
}

void add_idle_passes(const Ctx& x, CpPlan& p) {
  const int64_t W = x.W;
  const size_t P = p.rank_start.size();
  std::vector<size_t> order(P);
  for (size_t q = 0; q < P; ++q) order[q] = q;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p.step[a] < p.step[b]; });
  CpPlan out;
  out.offsets.push_back(0);
  std::vector<int64_t> used(static_cast<size_t>(W), -1);
  size_t q = 0;
  for (int64_t s = 0; s < p.num_steps; ++s) {
    const double begin = q < P ? p.start[order[q]] : 0.0;
    for (; q < P && p.step[order[q]] == s; ++q) {
      const size_t k = order[q];
      out.rank_start.push_back(p.rank_start[k]);
      out.group_size.push_back(p.group_size[k]);
      out.step.push_back(s);
      out.local_tokens.push_back(p.local_tokens[k]);
      out.start.push_back(p.start[k]);
      out.duration.push_back(p.duration[k]);
      out.seqs.insert(out.seqs.end(), p.seqs.begin() + p.offsets[k], p.seqs.begin() + p.offsets[k + 1]);
      out.offsets.push_back(static_cast<int64_t>(out.seqs.size()));
      for (int64_t r = p.rank_start[k]; r < p.rank_start[k] + p.group_size[k]; ++r) used[r] = s;
    }
    for (int64_t r = 0; r < W; ++r) {
      if (used[r] == s) continue;
      out.rank_start.push_back(r);
      out.group_size.push_back(1);
      out.step.push_back(s);
      out.local_tokens.push_back(0);
      out.start.push_back(begin);
      out.duration.push_back(x.opts.pass_overhead);
      out.offsets.push_back(static_cast<int64_t>(out.seqs.size()));
    }
  }
  out.cp_size = std::move(p.cp_size);
  out.makespan = p.makespan, out.lower_bound = p.lower_bound;
  out.num_steps = p.num_steps, out.candidates = p.candidates;
  p = std::move(out);
}

CpPlan build_steps(const Ctx& x, const std::vector<int32_t>& chosen, int order, const std::vector<char>& off) {
  const double O = x.opts.pass_overhead;
  const auto& caps = x.opts.caps;
  const auto& speed = x.opts.speed;
  const int64_t W = x.W;
  Passes ps(x.n, O);
  std::vector<int64_t> all(static_cast<size_t>(x.n));
  for (int64_t i = 0; i < x.n; ++i) all[i] = i;
  const bool fill_to_cap = (order & 2) != 0;
  std::vector<int64_t> remaining = sorted_items(x, chosen, std::move(all), (order & 1) ? 0 : 1), deferred;
  Scratch& sc = x.scratch;
  auto& owner = ready(sc.owner, W, int64_t{-1});
  std::vector<std::vector<int64_t>> no_levels;
  // pow2: ranks taken in each aligned block this step
  auto& level_used = x.opts.pow2 ? ready_levels(sc.level_used, x, int64_t{0}) : no_levels;
  auto reset = [&] {  // the groups taken this step, free again (the scratch as it was found)
    for (const auto& [s, c] : sc.ranges) {
      std::fill(owner.begin() + s, owner.begin() + s + c, int64_t{-1});
      for_blocks(level_used, s, c, [](int64_t) { return int64_t{0}; });
    }
    sc.ranges.clear();
  };
  using Entry = std::pair<double, int64_t>;  // (duration, pass): the least loaded group of a size first
  std::vector<std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>> open(x.sizes.size());
  int64_t step = 0;
  constexpr int64_t kOff = std::numeric_limits<int64_t>::max();  // owner of a rank left idle (off)
  while (!remaining.empty()) {
    reset();
    int64_t off_ranks = 0;
    for (auto& h : open) h = {};
    std::vector<int64_t> level_ptr(level_used.size(), 0);
    int64_t lp = 0, rp = W - 1;  // uniform ranks: wide groups from the left, single ranks from the right
    double limit = -1.0;         // the step's length: its first (longest) pass
    // fill_to_cap: single ranks may run past that length, up to the smaller of a full pass (cap_max tokens at
    // the remaining sequences' mean cost per token) and the remaining work per rank: a step as long as its
    // longest pass otherwise shrinks step after step as the sequences get shorter.
    double single_limit = -1.0;
    if (fill_to_cap) {
      long double work = 0.0L, tokens = 0.0L, cost = 0.0L;
      for (int64_t i : remaining) {
        const int64_t c = x.sizes[chosen[i]];
        work += static_cast<long double>(c) * x.t(i, c);
        tokens += x.L[i];
        cost += x.C[i];
      }
      const double per_token = tokens > 0 ? static_cast<double>(cost / tokens) : 0.0;
      single_limit = O + std::min(static_cast<double>(work) / x.speed_sum,
                                  per_token * static_cast<double>(x.cap_max) / x.speed_min);
    }
    const int64_t first_pass = static_cast<int64_t>(ps.start.size());
    auto take = [&](int64_t s, int64_t c, int64_t p) {
      sc.ranges.emplace_back(s, c);
      for (int64_t r = s; r < s + c; ++r) owner[r] = p;
      for_blocks(level_used, s, c, [](int64_t v) { return v + 1; });
    };
    // A free group of c ranks whose cap holds tok, or -1.
    auto find_block = [&](size_t k, int64_t c, int64_t tok) -> int64_t {
      if (c == 1) {
        if (x.uniform) {
          while (rp >= 0 && owner[rp] >= 0) --rp;
          return rp >= 0 ? rp : -1;
        }
        for (int64_t r = W - 1; r >= 0; --r)
          if (owner[r] < 0 && caps[r] >= tok) return r;
        return -1;
      }
      if (x.opts.pow2) {
        int64_t l = 0;
        while ((int64_t{1} << l) < c) ++l;
        const auto& lu = level_used[l];
        if (x.uniform) {
          auto& j = level_ptr[l];
          while (j < static_cast<int64_t>(lu.size()) && lu[j] > 0) ++j;
          return j < static_cast<int64_t>(lu.size()) ? j * c : -1;
        }
        for (size_t j = 0; j < lu.size(); ++j)
          if (lu[j] == 0 && x.level_cap[l][j] >= tok) return static_cast<int64_t>(j) * c;
        return -1;
      }
      if (x.uniform) {
        while (lp < W && owner[lp] >= 0) ++lp;
        while (rp >= 0 && owner[rp] >= 0) --rp;
        return lp + c - 1 <= rp ? lp : -1;
      }
      (void)k;
      int64_t run = 0;
      for (int64_t r = 0; r < W; ++r) {
        run = (owner[r] < 0 && caps[r] >= tok) ? run + 1 : 0;
        if (run == c) return r - c + 1;
      }
      return -1;
    };
    // A sequence that would wait for a later step joins a wider pass of this step instead, sharded at that
    // pass's size, where its tokens fit and the pass stays within the step's length: the step lasts as long
    // anyway (a long step's cap-limited ranks idle otherwise) and later steps get less to do.
    const bool join_wider = (order & 4) != 0;
    auto try_wider = [&](int64_t i, size_t k) -> bool {
      if (!join_wider || limit < 0) return false;
      for (size_t k2 = k + 1; k2 < x.sizes.size(); ++k2) {
        if (open[k2].empty()) continue;
        const int64_t p = open[k2].top().second;
        const int64_t c2 = x.sizes[k2], tok2 = cp_local_tokens(x.L[i], c2);
        const double t2 = x.t(i, c2);
        if (tok2 > ps.cap[p] - ps.tokens[p] || O + (ps.work[p] + t2) / ps.speed[p] > limit) continue;
        open[k2].pop();
        ps.add(p, i, tok2, t2);
        open[k2].emplace(ps.duration(p), p);
        return true;
      }
      return false;
    };
    for (int64_t r = 0; r < static_cast<int64_t>(off.size()); ++r)
      if (off[r]) take(r, 1, kOff), ++off_ranks;
    int64_t free_ranks = W - off_ranks, misses = 0;
    for (size_t q = 0; q < remaining.size(); ++q) {
      // A step with no free rank left that keeps refusing sequences is full: the rest waits (keeps the
      // builder near O(n) per step count instead of O(n) per step).
      if (free_ranks == 0 && misses > 256) {
        deferred.insert(deferred.end(), remaining.begin() + q, remaining.end());
        break;
      }
      const int64_t i = remaining[q];
      const size_t k = static_cast<size_t>(chosen[i]);
      const int64_t c = x.sizes[k], tok = cp_local_tokens(x.L[i], c);
      const double ti = x.t(i, c);
      // Join the least loaded pass of this size if it stays within the step and its cap.
      if (!open[k].empty()) {
        const int64_t p = open[k].top().second;
        // Within the step's length (its first pass; single ranks: see single_limit).
        if (tok <= ps.cap[p] - ps.tokens[p] && O + (ps.work[p] + ti) / ps.speed[p] <= (c == 1 ? std::max(limit, single_limit) : limit)) {
          open[k].pop();
          ps.add(p, i, tok, ti);
          open[k].emplace(ps.duration(p), p);
          misses = 0;
          continue;
        }
      }
      const int64_t s = find_block(k, c, tok);
      double sp = kInf;
      int64_t cap = std::numeric_limits<int64_t>::max();
      if (s >= 0) std::tie(cap, sp) = x.group(s, c);
      if (s < 0 || cap < tok || (limit >= 0 && O + ti / sp > limit)) {
        if (try_wider(i, k)) {
          misses = 0;
          continue;
        }
        deferred.push_back(i);
        ++misses;
        continue;
      }
      misses = 0;
      free_ranks -= c;
      const int64_t p = ps.open(s, c, cap, sp, 0.0, step);
      ps.add(p, i, tok, ti);
      take(s, c, p);
      if (limit < 0) limit = ps.duration(p);
      open[k].emplace(ps.duration(p), p);
    }
    // Every rank runs one pass per step: the idle ones an empty pass (a dummy micro-batch for the collectives).
    if (static_cast<int64_t>(ps.start.size()) == first_pass) {  // nothing placed (off ranks): no plan
      reset();
      CpPlan none;
      none.makespan = kInf;
      return none;
    }
    // Idle ranks (owner < 0 or kOff) run an empty pass: added to the winning plan only (add_idle_passes), so a
    // candidate's size is set by its sequences, not by world_size.
    remaining.swap(deferred);
    deferred.clear();
    ++step;
  }
  reset();
  return finish(x, chosen, ps, true);
}

}  // namespace cp_detail
}  // namespace packkit
