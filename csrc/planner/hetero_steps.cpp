// ogbfd over heterogeneous ranks (hetero_steps.hpp).
#include "hetero_steps.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "capacity_bitmap.hpp"
#include "packers.hpp"
#include "run_beside.hpp"

namespace packkit {

namespace {

// One step: per rank its items, tokens and cost.
struct Step {
  std::vector<std::vector<int64_t>> items;
  std::vector<int64_t> load;
  std::vector<double> cost;
};

// The step's three slowest rows (time = cost / speed), slowest first; -1 where the step has fewer rows.
struct Top3 {
  size_t at[3];
  double time[3];
};
Top3 slowest(const Step& st, const std::vector<double>& speed) {
  Top3 top{{SIZE_MAX, SIZE_MAX, SIZE_MAX}, {-1.0, -1.0, -1.0}};
  for (size_t r = 0; r < st.cost.size(); ++r) {
    const double t = st.cost[r] / speed[r];
    for (int k = 0; k < 3; ++k)
      if (t > top.time[k]) {
        for (int j = 2; j > k; --j) top.at[j] = top.at[j - 1], top.time[j] = top.time[j - 1];
        top.at[k] = r, top.time[k] = t;
        break;
      }
  }
  return top;
}

// The slowest time among rows other than a and b.
double slowest_other(const Top3& top, size_t a, size_t b) {
  for (int k = 0; k < 3; ++k)
    if (top.at[k] != a && top.at[k] != b) return std::max(top.time[k], 0.0);
  return 0.0;
}

// Moves or swaps out of the step's slowest row, best first, while one lowers the step's time by more than 1e-12
// of it. Rows hold few items (capacity / length), so every pair is tried; bounded by max_rounds changes.
void balance_in_step(Step& st, const int64_t* lengths, const std::vector<double>& costs,
                     const std::vector<int64_t>& capacity, const std::vector<double>& speed, int max_rounds) {
  const size_t ranks = st.cost.size();
  for (int round = 0; round < max_rounds; ++round) {
    const Top3 top = slowest(st, speed);
    const size_t m = top.at[0];
    if (m == SIZE_MAX || top.time[0] <= 0) return;
    double best = top.time[0] * (1 - 1e-12);
    size_t best_x = SIZE_MAX, best_j = SIZE_MAX, best_y = SIZE_MAX;  // best_y == SIZE_MAX: a move
    const auto& from = st.items[m];
    for (size_t xi = 0; xi < from.size(); ++xi) {
      const int64_t lx = lengths[from[xi]];
      const double cx = costs[static_cast<size_t>(from[xi])];
      for (size_t j = 0; j < ranks; ++j) {
        if (j == m) continue;
        const double others = slowest_other(top, m, j);
        if (others >= best) continue;
        // Room compared, not load + length summed: lengths near 2^62 would wrap the sum past int64.
        if (lx <= capacity[j] - st.load[j]) {
          const double t = std::max({others, (st.cost[m] - cx) / speed[m], (st.cost[j] + cx) / speed[j]});
          if (t < best) best = t, best_x = xi, best_j = j, best_y = SIZE_MAX;
        }
        const auto& to = st.items[j];
        for (size_t yi = 0; yi < to.size(); ++yi) {
          const int64_t ly = lengths[to[yi]];
          const double cy = costs[static_cast<size_t>(to[yi])];
          if (cy >= cx || lx - ly > capacity[j] - st.load[j] || ly - lx > capacity[m] - st.load[m]) continue;
          const double t =
              std::max({others, (st.cost[m] - cx + cy) / speed[m], (st.cost[j] + cx - cy) / speed[j]});
          if (t < best) best = t, best_x = xi, best_j = j, best_y = yi;
        }
      }
    }
    if (best_x == SIZE_MAX) return;
    const int64_t x = from[best_x];
    auto& to = st.items[best_j];
    st.items[m].erase(st.items[m].begin() + static_cast<std::ptrdiff_t>(best_x));
    st.load[m] -= lengths[x], st.cost[m] -= costs[static_cast<size_t>(x)];
    if (best_y != SIZE_MAX) {
      const int64_t y = to[best_y];
      to.erase(to.begin() + static_cast<std::ptrdiff_t>(best_y));
      st.items[m].push_back(y);
      st.load[m] += lengths[y], st.cost[m] += costs[static_cast<size_t>(y)];
      st.load[best_j] -= lengths[y], st.cost[best_j] -= costs[static_cast<size_t>(y)];
    }
    to.push_back(x);
    st.load[best_j] += lengths[x], st.cost[best_j] += costs[static_cast<size_t>(x)];
  }
}

}  // namespace

std::vector<int64_t> time_capacities(const std::vector<int64_t>& capacity, const std::vector<double>& speed,
                                     int64_t longest) {
  double tau = std::numeric_limits<double>::infinity();  // tokens per unit of speed the tightest rank allows
  for (size_t r = 0; r < capacity.size(); ++r) tau = std::min(tau, static_cast<double>(capacity[r]) / speed[r]);
  std::vector<int64_t> out(capacity.size());
  for (size_t r = 0; r < capacity.size(); ++r) {
    const double fair = std::ceil(speed[r] * tau);  // <= capacity[r] up to rounding
    const int64_t fill = fair >= static_cast<double>(capacity[r]) ? capacity[r] : static_cast<int64_t>(fair);
    out[r] = std::min(capacity[r], std::max(fill, longest));
  }
  return out;
}

namespace {

// Candidate 1, for any capacities and speeds: steps formed while packing.
Slots greedy_steps(const int64_t* lengths, int64_t n, const Int32Buffer& order, const std::vector<double>& costs,
                   const std::vector<int64_t>& capacity, const std::vector<double>& speed) {
  const size_t ranks = capacity.size();
  const int64_t cmax = *std::max_element(capacity.begin(), capacity.end());
  std::vector<Step> steps;
  // Steps keyed by their largest free row: stacks threaded through next_step, the bitmap holds every key with a
  // non-empty stack (dense capacities); a sorted set otherwise.
  const bool dense = cmax <= std::max<int64_t>(int64_t{1} << 22, 8 * n);
  std::vector<int64_t> head(dense ? static_cast<size_t>(cmax) + 1 : 0, -1), next_step;
  CapacityBitmap nonempty(dense ? cmax + 1 : 1);
  std::set<std::pair<int64_t, int64_t>> sparse;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t item = order[static_cast<size_t>(k)];
    const int64_t len = lengths[item];
    const double c = costs[static_cast<size_t>(item)];
    int64_t g = -1;
    if (dense) {
      const int64_t f = nonempty.find_next(len);
      if (f >= 0) {
        g = head[static_cast<size_t>(f)];
        head[static_cast<size_t>(f)] = next_step[static_cast<size_t>(g)];
        if (head[static_cast<size_t>(f)] < 0) nonempty.clear(f);
      }
    } else {
      auto it = sparse.lower_bound({len, int64_t{-1}});
      if (it != sparse.end()) g = it->second, sparse.erase(it);
    }
    if (g < 0) {
      g = static_cast<int64_t>(steps.size());
      steps.push_back({std::vector<std::vector<int64_t>>(ranks), std::vector<int64_t>(ranks, 0),
                       std::vector<double>(ranks, 0.0)});
      next_step.push_back(-1);
    }
    Step& st = steps[static_cast<size_t>(g)];
    size_t best = SIZE_MAX;
    double best_time = 0;
    for (size_t r = 0; r < ranks; ++r) {  // some row has room: the step's key is its largest free row
      if (capacity[r] - st.load[r] < len) continue;
      const double t = (st.cost[r] + c) / speed[r];
      if (best == SIZE_MAX || t < best_time) best = r, best_time = t;
    }
    st.items[best].push_back(item);
    st.load[best] += len;
    st.cost[best] += c;
    int64_t most_free = 0;
    for (size_t r = 0; r < ranks; ++r) most_free = std::max(most_free, capacity[r] - st.load[r]);
    if (most_free <= 0) continue;  // full steps are never searched again
    if (dense) {
      next_step[static_cast<size_t>(g)] = head[static_cast<size_t>(most_free)];
      if (head[static_cast<size_t>(most_free)] < 0) nonempty.set(most_free);
      head[static_cast<size_t>(most_free)] = g;
    } else {
      sparse.insert({most_free, g});
    }
  }
  Slots slots;
  slots.reserve(steps.size() * ranks);
  for (Step& st : steps) {
    balance_in_step(st, lengths, costs, capacity, speed, 8);
    for (auto& row : st.items) slots.push_back(std::move(row));
  }
  return slots;
}

// Candidate 2, when every speed is a small integer multiple m_i of one unit g (2/2/1/1; 2.2/1 with g = 0.2) and
// the longest item fits g * tau tokens: rank i stands for m_i identical virtual ranks of g * tau tokens (the
// time-fair capacities make that the same for every rank), planned as ogbfd's sorted steps (obfd rows sorted by
// cost, consecutive ones per step, in-step moves and swaps); rank i's row is the union of its virtual rows, so
// its time is their mean and its tokens within its capacity. False when the speeds are not of that form.
bool virtual_steps(const int64_t* lengths, int64_t n, const std::vector<double>& costs,
                   const std::vector<int64_t>& capacity, const std::vector<double>& speed, int64_t longest,
                   Slots& out) {
  const size_t ranks = capacity.size();
  const double slowest = *std::min_element(speed.begin(), speed.end());
  std::vector<int64_t> parts(ranks);
  int64_t total_parts = 0;
  for (int64_t d = 1; d <= 8 && total_parts == 0; ++d) {  // g = slowest / d
    int64_t sum = 0;
    bool exact = true;
    for (size_t r = 0; r < ranks && exact; ++r) {
      const double m = speed[r] / slowest * static_cast<double>(d);
      const double rounded = std::round(m);
      exact = rounded >= 1 && rounded <= 1 << 20 && std::fabs(m - rounded) <= 1e-9 * m;
      parts[r] = static_cast<int64_t>(rounded);
      sum += parts[r];
    }
    if (exact && sum <= 16 * static_cast<int64_t>(ranks) && sum <= static_cast<int64_t>(ranks) + n) total_parts = sum;
  }
  if (total_parts == 0) return false;
  int64_t unit = std::numeric_limits<int64_t>::max();  // virtual capacity: the least capacity / parts
  for (size_t r = 0; r < ranks; ++r) unit = std::min(unit, capacity[r] / parts[r]);
  if (unit < longest || unit < 1) return false;
  const BinAssignment bins = optimized_best_fit(lengths, n, unit);
  Slots virt = sorted_steps(bins, lengths, costs, unit, total_parts);
  const size_t steps = virt.size() / static_cast<size_t>(total_parts);
  out.assign(steps * ranks, {});
  for (size_t s = 0; s < steps; ++s) {
    size_t v = s * static_cast<size_t>(total_parts);
    for (size_t r = 0; r < ranks; ++r)
      for (int64_t k = 0; k < parts[r]; ++k, ++v) {
        auto& row = out[s * ranks + r];
        row.insert(row.end(), virt[v].begin(), virt[v].end());
      }
  }
  return true;
}

// Sum over steps of the slowest row's time: what a synchronous step waits for.
double total_time(const Slots& slots, const std::vector<double>& costs, const std::vector<double>& speed) {
  const size_t ranks = speed.size();
  double sum = 0;
  for (size_t s = 0; s * ranks < slots.size(); ++s) {
    double top = 0;
    for (size_t r = 0; r < ranks; ++r) {
      double c = 0;
      for (int64_t item : slots[s * ranks + r]) c += costs[static_cast<size_t>(item)];
      top = std::max(top, c / speed[r]);
    }
    sum += top;
  }
  return sum;
}

}  // namespace

Slots hetero_steps(const int64_t* lengths, int64_t n, const std::vector<double>& costs,
                   const std::vector<int64_t>& memory_cap, const std::vector<double>& speed) {
  const int64_t most = *std::max_element(memory_cap.begin(), memory_cap.end());  // every item fits it
  const Int32Buffer order = decreasing_order(lengths, n, most);
  const int64_t longest = n ? lengths[order[0]] : 0;
  const std::vector<int64_t> capacity = time_capacities(memory_cap, speed, longest);
  Slots greedy, virt;
  bool have_virtual = false;
  run_beside(n >= kParallelItems / 16, [&] { have_virtual = virtual_steps(lengths, n, costs, capacity, speed, longest, virt); },
             [&] { greedy = greedy_steps(lengths, n, order, costs, capacity, speed); });
  if (!have_virtual) return greedy;
  // The lower total time (sum over steps of the slowest row: what synchronous steps cost), ties to fewer steps,
  // then to the greedy layout. A few more steps can be faster: 4,403 balanced steps against 4,391 at 1.0255.
  const double a = total_time(virt, costs, speed), b = total_time(greedy, costs, speed);
  if (a != b) return a < b ? virt : greedy;
  return virt.size() < greedy.size() ? virt : greedy;
}

}  // namespace packkit
