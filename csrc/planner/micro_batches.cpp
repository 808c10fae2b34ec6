#include "micro_batches.hpp"

#include "step_search.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <utility>

namespace packkit {
namespace {

// Segment tree over bins holding each subtree's least cost and most free room: the cheapest bin with room for an
// item (branch and bound, ties to the lower bin), or the first bin with room, each in about O(log bins).
class BinTree {
 public:
  BinTree(size_t bins, int64_t room) : size_(1) {
    while (size_ < bins) size_ <<= 1;
    load_.assign(2 * size_, kInf);
    room_.assign(2 * size_, -1);
    for (size_t b = 0; b < bins; ++b) load_[size_ + b] = 0.0, room_[size_ + b] = room;
    for (size_t i = size_ - 1; i >= 1; --i) pull(i);
  }
  int64_t first_fit(int64_t need) const {  // -1 if none
    if (room_[1] < need) return -1;
    size_t i = 1;
    while (i < size_) i = room_[2 * i] >= need ? 2 * i : 2 * i + 1;
    return static_cast<int64_t>(i - size_);
  }
  // Descends towards the cheaper child that has room: the cheapest bin with room whenever the cheapest bin of
  // each visited subtree has room (the usual case), else a cheap one with room. -1 if none.
  int64_t cheapest_fit(int64_t need) const {
    if (room_[1] < need) return -1;
    size_t i = 1;
    while (i < size_) {
      const size_t l = 2 * i, r = l + 1;
      if (room_[l] < need) i = r;
      else if (room_[r] < need) i = l;
      else i = load_[r] < load_[l] ? r : l;
    }
    return static_cast<int64_t>(i - size_);
  }
  void set(size_t bin, int64_t room, double key) {
    size_t i = size_ + bin;
    room_[i] = room;
    load_[i] = key;
    for (i >>= 1; i >= 1; i >>= 1) pull(i);
  }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  void pull(size_t i) {
    load_[i] = std::min(load_[2 * i], load_[2 * i + 1]);
    room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
  }
  size_t size_;
  std::vector<double> load_;
  std::vector<int64_t> room_;
};

// Items (costliest first) into num_bins bins of `capacity` tokens: the first `lpt` items each to the bin with room
// holding the least cost + tokens (each relative to its mean per bin: longest processing time first on both, so
// every bin gets a similar mix of long and short items and swaps can balance them later), the rest longest first
// by first fit (tight where the cap fragments the room). bin_of[item], load, room are set; false if an item fits
// nowhere.
bool pack(const std::vector<int64_t>& items, size_t lpt, const int64_t* lengths, const double* costs,
          int64_t capacity, size_t num_bins, std::vector<int64_t>& bin_of, std::vector<double>& load,
          std::vector<int64_t>& room) {
  load.assign(num_bins, 0.0);
  room.assign(num_bins, capacity);
  BinTree tree(num_bins, capacity);
  double total_cost = 0, total_tokens = 0;
  for (int64_t item : items) total_cost += costs[item], total_tokens += static_cast<double>(lengths[item]);
  const double per_cost = total_cost > 0 ? static_cast<double>(num_bins) / total_cost : 0.0;
  const double per_token = total_tokens > 0 ? static_cast<double>(num_bins) / total_tokens : 0.0;
  auto put = [&](int64_t item, int64_t b) {
    bin_of[item] = b;
    room[b] -= lengths[item];
    load[b] += costs[item];
    const double u = load[b] * per_cost, v = static_cast<double>(capacity - room[b]) * per_token;
    tree.set(static_cast<size_t>(b), room[b], u + v);
  };
  lpt = std::min(lpt, items.size());
  for (size_t j = 0; j < lpt; ++j) {
    const int64_t item = items[j];
    const int64_t b = tree.cheapest_fit(lengths[item]);
    if (b < 0) return false;
    put(item, b);
  }
  if (lpt < items.size()) {
    std::vector<int64_t> tail(items.begin() + static_cast<std::ptrdiff_t>(lpt), items.end());
    std::stable_sort(tail.begin(), tail.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    for (int64_t item : tail) {
      const int64_t b = tree.first_fit(lengths[item]);
      if (b < 0) return false;
      put(item, b);
    }
  }
  return true;
}

// Pack with decreasing LPT share until feasible.
bool pack_any(const std::vector<int64_t>& items, const int64_t* lengths, const double* costs, int64_t capacity,
              size_t num_bins, std::vector<int64_t>& bin_of, std::vector<double>& load, std::vector<int64_t>& room) {
  const size_t m = items.size();
  const size_t tries[] = {m, m - m / 8, m - m / 4, m / 2, m / 4, 0};
  size_t last = SIZE_MAX;
  for (size_t lpt : tries) {
    if (lpt == last) continue;
    last = lpt;
    if (pack(items, lpt, lengths, costs, capacity, num_bins, bin_of, load, room)) return true;
  }
  return false;
}

// Item indices by cost descending, ties by length descending then index ascending. An LSD radix sort on the
// cost's bits (a non-negative double's bits order like the value; stable, so equal costs keep index order), then
// equal-cost runs sorted by length (stable). O(n) passes instead of a comparison sort.
std::vector<int64_t> costliest_first(const int64_t* lengths, const double* costs, size_t n) {
  std::vector<uint64_t> key(n), key2(n);
  std::vector<int64_t> ord(n), tmp(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits;
    const double c = costs[i] == 0 ? 0.0 : costs[i];  // -0.0 -> 0.0
    std::memcpy(&bits, &c, sizeof bits);
    key[i] = ~bits;  // ascending ~bits = descending cost
    ord[i] = static_cast<int64_t>(i);
  }
  size_t count[256];
  for (int shift = 0; shift < 64; shift += 8) {
    std::fill(count, count + 256, size_t{0});
    for (size_t i = 0; i < n; ++i) ++count[(key[i] >> shift) & 0xff];
    if (n == 0 || count[(key[0] >> shift) & 0xff] == n) continue;  // every key has this byte: nothing moves
    size_t sum = 0;
    for (size_t& c : count) {
      const size_t here = c;
      c = sum;
      sum += here;
    }
    for (size_t i = 0; i < n; ++i) {
      const size_t at = count[(key[i] >> shift) & 0xff]++;
      key2[at] = key[i];
      tmp[at] = ord[i];
    }
    key.swap(key2);
    ord.swap(tmp);
  }
  for (size_t i = 0; i < n;) {  // equal costs: longer first (stable: then lower index)
    size_t j = i + 1;
    while (j < n && key[j] == key[i]) ++j;
    if (j - i > 32) {
      std::stable_sort(ord.begin() + static_cast<std::ptrdiff_t>(i), ord.begin() + static_cast<std::ptrdiff_t>(j),
                       [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    } else {  // short runs (usually equal lengths too): a stable insertion sort, no buffer to allocate
      for (size_t a = i + 1; a < j; ++a)
        for (size_t b = a; b > i && lengths[ord[b]] > lengths[ord[b - 1]]; --b) std::swap(ord[b], ord[b - 1]);
    }
    i = j;
  }
  return ord;
}

// The layout at K (steps dealt, in-step search done) into out_grid; false if some item fits in no micro-batch.
bool initial_grid(const int64_t* lengths, const double* costs, int64_t n, int64_t capacity, int64_t dp, int64_t K,
                  bool equal_count, int refine_rounds, const std::vector<int64_t>& ord, StepGrid& out_grid) {
  const size_t B = static_cast<size_t>(K * dp);
  const size_t un = static_cast<size_t>(n);
  std::vector<int64_t> bin_of(un);
  std::vector<int64_t> slot_of(un);  // step * dp + rank
  std::vector<double> load;
  std::vector<int64_t> room;
  if (!equal_count) {
    if (!pack_any(ord, lengths, costs, capacity, B, bin_of, load, room)) return false;
    // micro-batches by cost, dp consecutive ones per step
    std::vector<size_t> bins(B);
    std::iota(bins.begin(), bins.end(), size_t{0});
    std::stable_sort(bins.begin(), bins.end(), [&](size_t a, size_t b) { return load[a] > load[b]; });
    std::vector<int64_t> slot(B);
    for (size_t j = 0; j < B; ++j) slot[bins[j]] = static_cast<int64_t>(j);
    for (size_t i = 0; i < un; ++i) slot_of[i] = slot[static_cast<size_t>(bin_of[i])];
  } else {
    const size_t udp = static_cast<size_t>(dp);
    std::vector<std::vector<int64_t>> ranks(udp);
    for (auto& r : ranks) r.reserve(un / udp);
    std::vector<double> rload(udp, 0.0);
    std::vector<int64_t> rtok(udp, 0);
    std::vector<size_t> target(udp);
    for (size_t start = 0; start < un; start += udp) {  // rounds of dp items, costliest to the cheapest rank
      std::iota(target.begin(), target.end(), size_t{0});
      std::sort(target.begin(), target.end(), [&](size_t a, size_t b) {
        if (rload[a] != rload[b]) return rload[a] < rload[b];
        if (rtok[a] != rtok[b]) return rtok[a] < rtok[b];
        return a < b;
      });
      for (size_t j = 0; j < udp; ++j) {
        const int64_t item = ord[start + j];
        const size_t r = target[j];
        ranks[r].push_back(item);  // costliest first within the rank
        rload[r] += costs[item];
        rtok[r] += lengths[item];
      }
    }
    std::vector<size_t> bins(static_cast<size_t>(K));
    std::vector<int64_t> step_of(static_cast<size_t>(K));
    for (size_t r = 0; r < udp; ++r) {  // each rank's items into K micro-batches; step k = its k-th costliest
      if (!pack_any(ranks[r], lengths, costs, capacity, static_cast<size_t>(K), bin_of, load, room)) return false;
      std::iota(bins.begin(), bins.end(), size_t{0});
      std::stable_sort(bins.begin(), bins.end(), [&](size_t a, size_t b) { return load[a] > load[b]; });
      for (size_t j = 0; j < bins.size(); ++j) step_of[bins[j]] = static_cast<int64_t>(j);
      for (int64_t item : ranks[r]) slot_of[item] = step_of[bin_of[item]] * dp + static_cast<int64_t>(r);
    }
  }
  // The grid of steps (micro-batch m = step * dp + rank; items costliest first inside one), then the local search
  // inside each step.
  auto refine = [&](StepGrid& grid, size_t s) {
    search_in_step(grid, s, lengths, costs, capacity, !equal_count, refine_rounds);
  };
  auto make_grid = [&](const std::vector<int64_t>& slot) {
    StepGrid grid;
    grid.dp = dp;
    grid.items.resize(B);
    grid.load.assign(B, 0.0);
    grid.tok.assign(B, 0);
    std::vector<int64_t> count(B, 0);
    for (size_t i = 0; i < un; ++i) ++count[static_cast<size_t>(slot[i])];
    for (size_t m = 0; m < B; ++m) grid.items[m].reserve(static_cast<size_t>(count[m]));
    for (int64_t item : ord) {
      const size_t m = static_cast<size_t>(slot[static_cast<size_t>(item)]);
      grid.items[m].push_back(item);
      grid.load[m] += costs[item], grid.tok[m] += lengths[item];
    }
    for (size_t st = 0; st < static_cast<size_t>(K); ++st) refine(grid, st);
    return grid;
  };
  out_grid = make_grid(slot_of);
  return true;
}

// Where a long item holds a step's maximum that no partner in its step can offset: the cross-step search, then
// (without equal_count) the micro-batches dealt into steps again by cost, and the in-step search again on the
// steps that changed, until a cross-step pass finds nothing or the search_rounds budget is spent.
void search_grid(StepGrid& grid, const int64_t* lengths, const double* costs, int64_t capacity, int64_t dp, int64_t K,
                 bool equal_count, int refine_rounds, int64_t search_rounds, double goal,
                 const std::vector<int64_t>& ord) {
  const size_t B = static_cast<size_t>(K * dp), udp = static_cast<size_t>(dp);
  auto refine = [&](StepGrid& g, size_t s) {
    search_in_step(g, s, lengths, costs, capacity, !equal_count, refine_rounds);
  };
  double total = 0;
  for (double c : grid.load) total += c;
  const double goal_sum = goal * total / static_cast<double>(dp);
  if (search_rounds > 0 && step_balance(grid) > goal) {
    std::vector<char> changed;
    int64_t left = search_rounds;
    while (left > 0 && step_balance(grid) > goal) {  // every pass makes >= 1 change; ends on a pass finding none
      const int64_t made =
          search_across_steps(grid, lengths, costs, capacity, ord, !equal_count, left, changed, goal_sum);
      if (made == 0) break;
      left -= made;
      if (!equal_count) {  // the searched micro-batches dealt into steps again by cost (the best grouping of them)
        std::vector<size_t> bins(B);
        std::iota(bins.begin(), bins.end(), size_t{0});
        std::stable_sort(bins.begin(), bins.end(), [&](size_t a, size_t b) { return grid.load[a] > grid.load[b]; });
        StepGrid dealt;
        dealt.dp = dp;
        dealt.items.resize(B), dealt.load.resize(B), dealt.tok.resize(B);
        for (size_t j = 0; j < B; ++j)
          dealt.items[j].swap(grid.items[bins[j]]), dealt.load[j] = grid.load[bins[j]], dealt.tok[j] = grid.tok[bins[j]];
        for (size_t j = 0; j < B; ++j)
          if (bins[j] != j) changed[j / udp] = changed[bins[j] / udp] = 1;
        grid = std::move(dealt);
      }
      for (size_t s = 0; s < static_cast<size_t>(K); ++s)
        if (changed[s]) refine(grid, s);
    }
  }
}

// The grid as the layout's output (rank-major micro-batches r * K + s).
MicroBatchLayout emit(const StepGrid& grid, const int64_t* lengths, const double* costs, int64_t n, int64_t dp,
                      int64_t K) {
  MicroBatchLayout out;
  const size_t B = static_cast<size_t>(K * dp), udp = static_cast<size_t>(dp), un = static_cast<size_t>(n);
  std::vector<int64_t> final_of(un);
  // final micro-batch (rank-major r * K + s) of each item; sums recomputed (the searches update them incrementally)
  out.offsets.assign(B + 1, 0);
  out.tokens.assign(B, 0);
  out.costs.assign(B, 0.0);
  for (size_t s = 0; s < static_cast<size_t>(K); ++s) {
    for (size_t r = 0; r < udp; ++r) {
      const size_t mb = r * static_cast<size_t>(K) + s;
      double c = 0;
      int64_t t = 0;
      for (int64_t item : grid.items[s * udp + r])
        c += costs[item], t += lengths[item], final_of[item] = static_cast<int64_t>(mb);
      out.tokens[mb] = t, out.costs[mb] = c;
      out.offsets[mb + 1] = static_cast<int64_t>(grid.items[s * udp + r].size());
    }
  }
  for (size_t mb = 0; mb < B; ++mb) out.offsets[mb + 1] += out.offsets[mb];
  out.order.resize(un);
  {
    std::vector<int64_t> next(out.offsets.begin(), out.offsets.end() - 1);
    for (size_t i = 0; i < un; ++i)  // ascending inside each micro-batch
      out.order[static_cast<size_t>(next[static_cast<size_t>(final_of[i])]++)] = static_cast<int64_t>(i);
  }
  out.feasible = true;
  return out;
}

}  // namespace

MicroBatchLayout rl_micro_batches(const int64_t* lengths, const double* costs, int64_t n, int64_t capacity,
                                  int64_t dp, int64_t K, bool equal_count, int refine_rounds, int64_t search_rounds,
                                  double search_above, double goal_margin, bool try_next) {
  if (n < 0 || capacity < 1 || dp < 1 || K < 1) throw std::invalid_argument("rl_micro_batches: bad arguments");
  if (equal_count && n % dp) throw std::invalid_argument("rl_micro_batches: equal_count needs n % dp == 0");
  for (int64_t i = 0; i < n; ++i)
    if (lengths[i] < 0 || lengths[i] > capacity || !(costs[i] >= 0) || !std::isfinite(costs[i]))
      throw std::invalid_argument("rl_micro_batches: lengths must be in [0, capacity] and costs finite and >= 0");
  // Costliest first, ties by length (longer first) then index.
  const std::vector<int64_t> ord = costliest_first(lengths, costs, static_cast<size_t>(n));
  struct Try {
    int64_t K;
    StepGrid grid;
    double bound, goal, balance;
  };
  std::vector<Try> tries;
  for (int64_t k = K; k <= K + (try_next ? 1 : 0); ++k) {
    if (!tries.empty() && tries[0].balance <= tries[0].goal) break;  // K needs no search: K + 1 is not laid out
    Try t{k, StepGrid{}, std::numeric_limits<double>::quiet_NaN(), search_above, 1.0};
    if (!initial_grid(lengths, costs, n, capacity, dp, k, equal_count, refine_rounds, ord, t.grid)) continue;
    // The search stops at the goal max(search_above, bound + goal_margin) where the certified bound is known.
    if (goal_margin >= 0) t.bound = step_balance_bound(lengths, costs, n, capacity, dp, k);
    // ... and never above search_above + goal_margin (1.003) where the bound is half a margin below that.
    if (!std::isnan(t.bound)) {
      t.goal = std::max(search_above, t.bound + goal_margin);
      if (t.bound + goal_margin / 2 <= search_above + goal_margin) t.goal = std::min(t.goal, search_above + goal_margin);
    }
    t.balance = step_balance(t.grid);
    tries.push_back(std::move(t));
  }
  if (tries.empty()) return MicroBatchLayout{};
  // The layout that starts better is searched first (where K misses its goal, K + 1 usually starts lower: no search
  // budget is spent on a hopeless K); the other, with a quarter of the budget (on the --heavy rows it never beat the
  // first), only if the first misses its goal. The best balance is kept (ties: fewer micro-batches).
  std::stable_sort(tries.begin(), tries.end(), [](const Try& a, const Try& b) { return a.balance < b.balance; });
  for (Try& t : tries) {
    const int64_t rounds = &t == &tries[0] ? search_rounds : search_rounds / 4;
    if (rounds > 0 && t.balance > t.goal) {
      search_grid(t.grid, lengths, costs, capacity, dp, t.K, equal_count, refine_rounds, rounds, t.goal, ord);
      t.balance = step_balance(t.grid);
    }
    if (t.balance <= t.goal) break;
  }
  const Try* best = &tries[0];
  for (const Try& t : tries)
    if (t.balance < best->balance || (t.balance == best->balance && t.K < best->K)) best = &t;
  MicroBatchLayout out = emit(best->grid, lengths, costs, n, dp, best->K);
  out.num_micro_batches = best->K, out.bound = best->bound, out.goal = best->goal;
  return out;
}

}  // namespace packkit
