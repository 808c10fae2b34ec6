#include "dp_layout.hpp"
#include "run_beside.hpp"

#include <algorithm>
#include <numeric>

namespace packkit {

namespace {

Slots group_by_bin(const BinAssignment& bins) {
  Slots slots(static_cast<size_t>(bins.num_bins));
  for (size_t k = 0; k < bins.order.size(); ++k) slots[static_cast<size_t>(bins.bin_at[k])].push_back(bins.order[k]);
  return slots;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Mutable state of one step's bins during local search.
struct StepState {
  const int64_t* lengths;
  const std::vector<double>& costs;
  int64_t capacity;
  bool fill_empty = true;  // may a move put an item into an empty row (one more row)?
  size_t max_items = SIZE_MAX;  // a move never gives a row more items than this (swaps keep the counts)
  std::vector<std::vector<int64_t>*> bins;
  std::vector<double> cost;
  std::vector<int64_t> load;
  std::vector<std::pair<double, int64_t>> scratch;  // reused by improve_once: no allocation per call

  StepState(const int64_t* l, const std::vector<double>& c, int64_t cap)
      : lengths(l), costs(c), capacity(cap) {}

  void add(std::vector<int64_t>* bin) {
    bins.push_back(bin);
    double c = 0;
    int64_t t = 0;
    for (int64_t i : *bin) {
      c += costs[static_cast<size_t>(i)];
      t += lengths[i];
    }
    cost.push_back(c);
    load.push_back(t);
  }

  size_t argmax() const {
    return static_cast<size_t>(std::max_element(cost.begin(), cost.end()) - cost.begin());
  }

  // Transfers item at position pi of bin m to bin t, and (if pj >= 0) item at position pj of t to m.
  void exchange(size_t m, size_t pi, size_t t, int64_t pj) {
    auto& bm = *bins[m];
    auto& bt = *bins[t];
    const int64_t i = bm[pi];
    double delta = costs[static_cast<size_t>(i)];
    int64_t dlen = lengths[i];
    if (pj >= 0) {
      const int64_t j = bt[static_cast<size_t>(pj)];
      delta -= costs[static_cast<size_t>(j)];
      dlen -= lengths[j];
      bm[pi] = j;
      bt[static_cast<size_t>(pj)] = i;
    } else {
      bm[pi] = bm.back();
      bm.pop_back();
      bt.push_back(i);
    }
    cost[m] -= delta;
    cost[t] += delta;
    load[m] -= dlen;
    load[t] += dlen;
  }

  // One best improving move or swap out of the costliest bin. Returns false when none exists.
  bool improve_once() {
    const size_t m = argmax();
    const double top = cost[m];
    double best = top - 1e-12 * top;  // must beat the current maximum by more than rounding
    size_t best_pi = 0, best_t = 0;
    int64_t best_pj = -2;
    const auto& bm = *bins[m];
    const int64_t free_m = capacity - load[m];
    // Pruning that never changes the result (costs are >= 0): a move or swap of item i leaves bin m
    // at >= top - ci, and a pair's larger bin is >= the pair's mean (a 1e-9 margin covers rounding).
    double max_ci = 0;
    for (int64_t i : bm) max_ci = std::max(max_ci, costs[static_cast<size_t>(i)]);
    std::vector<std::pair<double, int64_t>>& sorted_t = scratch;  // (cost, position) of target's items
    for (size_t t = 0; t < bins.size(); ++t) {
      if (top - max_ci >= best) break;  // best only falls: no later target can beat it either
      if (t == m || cost[t] >= top) continue;
      if ((top + cost[t]) * 0.5 * (1 - 1e-9) >= best) continue;
      const int64_t free_t = capacity - load[t];
      const double half_gap = (top - cost[t]) / 2;
      auto& bt = *bins[t];
      sorted_t.clear();
      for (size_t q = 0; q < bt.size(); ++q) sorted_t.emplace_back(costs[static_cast<size_t>(bt[q])], static_cast<int64_t>(q));
      const bool scan_all = sorted_t.size() <= 8;  // small rows: try every swap, no sort needed
      if (!scan_all) std::sort(sorted_t.begin(), sorted_t.end());
      for (size_t pi = 0; pi < bm.size(); ++pi) {
        const int64_t i = bm[pi];
        const double ci = costs[static_cast<size_t>(i)];
        if (top - ci >= best) continue;
        const int64_t li = lengths[i];
        if (li <= free_t && (fill_empty || !bt.empty()) && bt.size() < max_items) {  // move i alone (into an empty row if allowed)
          const double pair_max = std::max(top - ci, cost[t] + ci);
          if (pair_max < best) best = pair_max, best_pi = pi, best_t = t, best_pj = -1;
        }
        // swap with j whose cost is nearest ci - half_gap (that transfer levels the pair)
        const double want = ci - half_gap;
        ptrdiff_t lo = 0, hi = static_cast<ptrdiff_t>(sorted_t.size());
        if (!scan_all) {
          auto pos = std::lower_bound(sorted_t.begin(), sorted_t.end(), std::make_pair(want, int64_t{-1}));
          const ptrdiff_t centre = pos - sorted_t.begin();
          lo = std::max<ptrdiff_t>(0, centre - 3), hi = std::min(hi, centre + 3);
        }
        for (ptrdiff_t k = lo; k < hi; ++k) {
          const double cj = sorted_t[static_cast<size_t>(k)].first;
          const int64_t pj = sorted_t[static_cast<size_t>(k)].second;
          const int64_t lj = lengths[bt[static_cast<size_t>(pj)]];
          if (cj >= ci || lj - li > free_m || li - lj > free_t) continue;
          const double d = ci - cj;
          const double pair_max = std::max(top - d, cost[t] + d);
          if (pair_max < best) best = pair_max, best_pi = pi, best_t = t, best_pj = pj;
        }
      }
    }
    if (best_pj == -2) return false;
    exchange(m, best_pi, best_t, best_pj);
    return true;
  }

  void refine() {
    // Each accepted step strictly lowers the sum of squared bin costs, so this terminates; the
    // cap bounds the work on steps with very many items.
    const size_t max_rounds = 32 * bins.size() + 64;
    for (size_t round = 0; round < max_rounds && improve_once(); ++round) {
    }
  }
};

double bin_cost(const std::vector<int64_t>& bin, const std::vector<double>& costs) {
  double c = 0;
  for (int64_t i : bin) c += costs[static_cast<size_t>(i)];
  return c;
}

// Gives empty slots of the last step one item each from the costliest bins of other steps, when
// that strictly lowers the donor step's maximum and does not raise the last step's maximum.
void fill_last_step(Slots& slots, const std::vector<double>& costs, int64_t dp, size_t max_fill) {
  const size_t num_steps = slots.size() / static_cast<size_t>(dp);
  if (num_steps < 2) return;
  const size_t last = (num_steps - 1) * static_cast<size_t>(dp);
  double last_max = 0;
  std::vector<size_t> empty;
  for (size_t k = last; k < slots.size(); ++k) {
    if (slots[k].empty()) empty.push_back(k);
    last_max = std::max(last_max, bin_cost(slots[k], costs));
  }
  if (empty.size() > max_fill) empty.resize(max_fill);  // each filled slot is one more row
  if (empty.empty()) return;
  std::vector<double> row_cost(last);  // bins of the other steps, computed once
  for (size_t k = 0; k < last; ++k) row_cost[k] = bin_cost(slots[k], costs);
  for (size_t e : empty) {
    // Best donor: the step whose maximum drops the most.
    double best_gain = 0, best_cost = 0;
    size_t best_bin = 0, best_pos = 0;
    for (size_t s = 0; s + 1 < num_steps; ++s) {
      double top = -1, second = 0;
      size_t m = 0;
      for (size_t k = s * static_cast<size_t>(dp); k < (s + 1) * static_cast<size_t>(dp); ++k) {
        const double c = row_cost[k];
        if (c > top) second = std::max(second, top), top = c, m = k;
        else second = std::max(second, c);
      }
      if (slots[m].size() < 2) continue;
      for (size_t p = 0; p < slots[m].size(); ++p) {
        const double ci = costs[static_cast<size_t>(slots[m][p])];
        if (ci > last_max) continue;
        const double gain = top - std::max(top - ci, second);
        // equal gains: move the cheaper item (the smaller change)
        if (gain > best_gain || (gain == best_gain && gain > 0 && ci < best_cost))
          best_gain = gain, best_cost = ci, best_bin = m, best_pos = p;
      }
    }
    if (best_gain <= 0) break;
    auto& donor = slots[best_bin];
    row_cost[best_bin] -= best_cost;
    slots[e].push_back(donor[best_pos]);
    donor[best_pos] = donor.back();
    donor.pop_back();
  }
}

// Orders each step's bins over ranks so that every rank's running total stays level: the step's
// costliest bin goes to the rank with the least accumulated cost (LPT across steps). Without this
// the sorted layout would hand rank 0 the costliest bin of every step.
void assign_ranks(Slots& slots, const std::vector<double>& costs, int64_t dp_size) {
  const size_t dp = static_cast<size_t>(dp_size);
  std::vector<double> total(dp, 0.0);
  std::vector<size_t> bins_by_cost(dp), ranks_by_total(dp);
  std::vector<double> cost(dp);
  Slots step(dp);
  for (size_t s = 0; s * dp < slots.size(); ++s) {
    for (size_t r = 0; r < dp; ++r) cost[r] = bin_cost(slots[s * dp + r], costs);
    std::iota(bins_by_cost.begin(), bins_by_cost.end(), size_t{0});
    std::stable_sort(bins_by_cost.begin(), bins_by_cost.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
    std::iota(ranks_by_total.begin(), ranks_by_total.end(), size_t{0});
    std::stable_sort(ranks_by_total.begin(), ranks_by_total.end(), [&](size_t a, size_t b) { return total[a] < total[b]; });
    for (size_t k = 0; k < dp; ++k) {
      step[ranks_by_total[k]] = std::move(slots[s * dp + bins_by_cost[k]]);
      total[ranks_by_total[k]] += cost[bins_by_cost[k]];
    }
    for (size_t r = 0; r < dp; ++r) slots[s * dp + r] = std::move(step[r]);
  }
}

}  // namespace

Slots deal_in_order(const BinAssignment& bins, int64_t dp_size) {
  Slots slots = group_by_bin(bins);
  slots.resize(static_cast<size_t>(round_up(bins.num_bins, dp_size)));
  return slots;
}

namespace {

// From this many items the candidates run on two threads: each is then several milliseconds of
// work, against tens of microseconds to start a thread. Their results never depend on it.
constexpr size_t kBesideItems = size_t{1} << 14;

double sum_of_step_maxima(const Slots& slots, const std::vector<double>& costs, size_t dp) {
  double sum = 0;
  for (size_t s = 0; s * dp < slots.size(); ++s) {
    double top = 0;
    for (size_t k = s * dp; k < (s + 1) * dp; ++k) top = std::max(top, bin_cost(slots[k], costs));
    sum += top;
  }
  return sum;
}

// Improves a step-major layout in place: moves/swaps inside each step, empty rows of the last step
// filled from other steps (while the layout has at most max_rows non-empty rows).
void polish(Slots& slots, const int64_t* lengths, const std::vector<double>& costs, int64_t capacity, size_t dp,
            size_t max_rows, size_t max_items = SIZE_MAX) {
  size_t rows = 0, empty = 0;
  for (const auto& row : slots) rows += !row.empty(), empty += row.empty();
  // Only the last step has empty rows; moves may fill them while the row count stays in bounds.
  const bool may_fill = rows + empty <= max_rows;
  auto refine_step = [&](size_t s) {
    StepState state(lengths, costs, capacity);
    state.fill_empty = may_fill;
    state.max_items = max_items;
    for (size_t k = s * dp; k < (s + 1) * dp; ++k) state.add(&slots[k]);
    state.refine();
  };
  const size_t num_steps = slots.size() / dp;
  for (size_t s = 0; s < num_steps; ++s) refine_step(s);
  fill_last_step(slots, costs, static_cast<int64_t>(dp), max_rows > rows ? max_rows - rows : 0);
  if (num_steps > 0) refine_step(num_steps - 1);
}

// Moves the one step holding empty rows to the end; false if empty rows are in several steps or
// the layout has more than `max_rows` non-empty rows.
bool empty_rows_last(Slots& slots, size_t dp, size_t max_rows) {
  size_t with_empty = slots.size() / dp, count = 0, rows = 0;
  for (size_t s = 0; s * dp < slots.size(); ++s)
    for (size_t k = s * dp; k < (s + 1) * dp; ++k) {
      if (!slots[k].empty()) ++rows;
      else if (with_empty != s) ++count, with_empty = s;
    }
  if (count > 1 || rows > max_rows) return false;
  if (count == 1 && with_empty + 1 < slots.size() / dp) {
    const size_t last = slots.size() / dp - 1;
    for (size_t r = 0; r < dp; ++r) std::swap(slots[with_empty * dp + r], slots[last * dp + r]);
  }
  return true;
}

// Every row holds at most max_items items (the layouts built while packing do not count them).
bool within_items(const Slots& slots, size_t max_items) {
  for (const auto& row : slots)
    if (row.size() > max_items) return false;
  return true;
}

}  // namespace

Slots sorted_steps(const BinAssignment& bins, const int64_t* lengths, const std::vector<double>& costs,
                   int64_t capacity, int64_t dp_size) {
  Slots by_bin = group_by_bin(bins);
  const size_t dp = static_cast<size_t>(dp_size);
  std::vector<double> cost(by_bin.size());
  for (size_t b = 0; b < by_bin.size(); ++b) cost[b] = bin_cost(by_bin[b], costs);
  std::vector<size_t> order(by_bin.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  Slots slots(static_cast<size_t>(round_up(bins.num_bins, dp_size)));
  for (size_t k = 0; k < order.size(); ++k) slots[k] = std::move(by_bin[order[k]]);
  polish(slots, lengths, costs, capacity, dp, static_cast<size_t>(bins.num_bins) + dp);
  return slots;
}

Slots balance_steps(const BinAssignment& bins, const int64_t* lengths,
                    const std::vector<double>& costs, int64_t capacity, int64_t dp_size,
                    const CostModel* length_cost, int64_t max_items) {
  Slots by_bin = group_by_bin(bins);
  const size_t item_limit = max_items > 0 ? static_cast<size_t>(max_items) : SIZE_MAX;
  if (dp_size == 1) return by_bin;
  const size_t dp = static_cast<size_t>(dp_size);

  // Three candidate layouts; the one with the lowest sum of step maxima wins (ties: the earlier).
  // Candidates 2 and 3 are kept only if they have at most dp more non-empty rows than best fit and
  // their empty rows (if any) are all in one step. Candidate 3 (the costliest: up to four
  // heavy_steps_first tries) runs on a second thread when there is enough work, 1 and 2 on this one.
  Slots grouped, heavy;
  bool grouped_ok = false, heavy_ok = false;
  const int64_t n = static_cast<int64_t>(costs.size());
  const size_t max_rows = static_cast<size_t>(bins.num_bins) + dp;  // non-empty rows allowed
  // Candidate 2: steps formed while packing.
  auto make_grouped = [&] {
    grouped = group_best_fit(lengths, n, costs, capacity, dp_size, false, length_cost);
    grouped_ok = empty_rows_last(grouped, dp, max_rows);
    if (grouped_ok) polish(grouped, lengths, costs, capacity, dp, max_rows);
    grouped_ok = grouped_ok && empty_rows_last(grouped, dp, max_rows);  // moves may fill empty rows
    grouped_ok = grouped_ok && within_items(grouped, item_limit);
  };
  // Candidate 3: the heavy tail planned first (see heavy_steps_first).
  auto make_heavy = [&] {
    // Each heavy step's leading row takes short items that best fit would use to close gaps, so many
    // heavy steps can cost a row or two over max_rows: then fewer heavy steps (their items join the
    // bulk), the most that fit. The first steps hold nearly all of the gain.
    size_t limit = SIZE_MAX;
    for (int attempt = 0; attempt < 4; ++attempt) {
      size_t used = 0;
      bool over = false;  // too many rows: known before the bulk is finished
      heavy = heavy_steps_first(lengths, n, costs, capacity, dp_size, limit, &used, max_rows, &over);
      if (heavy.empty() && !over) break;
      heavy_ok = !over && empty_rows_last(heavy, dp, max_rows);
      if (heavy_ok || used <= 1) break;
      limit = used * 3 / 4;
    }
    if (heavy_ok) polish(heavy, lengths, costs, capacity, dp, max_rows);
    heavy_ok = heavy_ok && empty_rows_last(heavy, dp, max_rows) && within_items(heavy, item_limit);
  };
  // Candidate 1: best-fit bins sorted by cost, dp consecutive bins per step.
  Slots slots(static_cast<size_t>(round_up(bins.num_bins, dp_size)));
  auto make_sorted = [&] {
    std::vector<double> cost(by_bin.size());
    for (size_t b = 0; b < by_bin.size(); ++b) cost[b] = bin_cost(by_bin[b], costs);
    std::vector<size_t> order(by_bin.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
    for (size_t k = 0; k < order.size(); ++k) slots[k] = std::move(by_bin[order[k]]);
    polish(slots, lengths, costs, capacity, dp, max_rows, item_limit);  // the bins are within max_items already
  };
  run_beside(costs.size() >= kBesideItems, make_heavy, [&] {
    make_sorted();
    make_grouped();
  });
  if (grouped_ok && sum_of_step_maxima(grouped, costs, dp) < sum_of_step_maxima(slots, costs, dp))
    slots = std::move(grouped);
  if (heavy_ok && sum_of_step_maxima(heavy, costs, dp) < sum_of_step_maxima(slots, costs, dp))
    slots = std::move(heavy);
  assign_ranks(slots, costs, dp_size);
  return slots;
}

}  // namespace packkit
