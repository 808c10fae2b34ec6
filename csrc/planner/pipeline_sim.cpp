// Op orders of torch.distributed.pipelining's schedules, the event simulator and the certified lower bound
// (pipeline_plan.hpp; derivation in docs/planner.md, "Pipeline parallelism").
#include <algorithm>
#include <stdexcept>

#include "pipeline_plan.hpp"

namespace packkit {
namespace pipeline {

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "interleaved") return Schedule::Interleaved;
  if (name == "zb") return Schedule::ZeroBubble;
  throw std::invalid_argument("schedule must be one of 'gpipe', '1f1b', 'interleaved', 'zb', got '" + name + "'");
}

namespace {

// torch's _get_1f1b_rank_ops (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble) without its None slots.
std::vector<Op> looped_rank_ops(int64_t pp, int64_t v, int64_t m, int64_t rank, bool zero_bubble) {
  const int64_t rounds = std::max<int64_t>(1, m / pp), per_round = m / rounds;
  const int64_t factor = zero_bubble ? 1 : 2;
  const int64_t warmup = std::min((v - 1) * per_round + factor * (pp - 1 - rank), m * v);
  const int64_t mb_ops = v * m, fwd_bwd = mb_ops - warmup, cooldown = mb_ops - fwd_bwd;
  auto fwd_stage = [&](int64_t step) { return static_cast<int32_t>(((step / per_round) % v) * pp + rank); };
  auto bwd_stage = [&](int64_t step) {
    return static_cast<int32_t>((v - 1 - ((step - warmup) / per_round) % v) * pp + rank);
  };
  std::vector<int32_t> fwd_mb(static_cast<size_t>(v * pp), 0), bwd_mb(fwd_mb), w_mb(fwd_mb);
  std::vector<int64_t> backward_ops;
  int64_t weight_count = 0;
  std::vector<Op> ops;
  ops.reserve(static_cast<size_t>(mb_ops * (zero_bubble ? 3 : 2)));
  auto push = [&](int32_t stage, int32_t kind, std::vector<int32_t>& counter) {
    ops.push_back({stage, kind, counter[static_cast<size_t>(stage)]++});
  };
  auto weight = [&]() {
    push(bwd_stage(backward_ops[static_cast<size_t>(weight_count)]), kWeight, w_mb);
    ++weight_count;
  };
  const int64_t num_1f1b = rank;  // zero bubble: ranks delay their first W by their index
  for (int64_t op = 0; op < warmup + fwd_bwd + cooldown; ++op) {
    if (op < warmup) {
      push(fwd_stage(op), kForward, fwd_mb);
      continue;
    }
    if (op < warmup + fwd_bwd) push(fwd_stage(op), kForward, fwd_mb);
    push(bwd_stage(op), kBackward, bwd_mb);
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= num_1f1b) weight();
  }
  while (zero_bubble && weight_count < static_cast<int64_t>(backward_ops.size())) weight();
  return ops;
}

}  // namespace

std::vector<std::vector<Op>> rank_orders(Schedule schedule, int64_t pp, int64_t v, int64_t m) {
  std::vector<std::vector<Op>> orders(static_cast<size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    auto& ops = orders[static_cast<size_t>(r)];
    const auto stage = static_cast<int32_t>(r);
    if (schedule == Schedule::GPipe) {  // ScheduleGPipe: every forward, then every backward, in mb order
      for (int32_t i = 0; i < m; ++i) ops.push_back({stage, kForward, i});
      for (int32_t i = 0; i < m; ++i) ops.push_back({stage, kBackward, i});
    } else if (schedule == Schedule::OneFOneB) {  // Schedule1F1B: min(m, pp - rank) warmup forwards, then B, F, ...
      const auto warmup = static_cast<int32_t>(std::min<int64_t>(m, pp - r));
      int32_t f = 0, b = 0;
      for (; f < warmup; ++f) ops.push_back({stage, kForward, f});
      while (b < m) {
        ops.push_back({stage, kBackward, b++});
        if (f < m) ops.push_back({stage, kForward, f++});
      }
    } else {
      ops = looped_rank_ops(pp, v, m, r, schedule == Schedule::ZeroBubble);
    }
  }
  return orders;
}

StageCosts stage_costs(const double* mb_fwd, int64_t m, int64_t stages, const std::vector<double>& layer_weights,
                       double bwd_ratio, double weight_fraction, bool split_weight) {
  StageCosts c;
  c.m = m;
  c.stages = stages;
  std::vector<double> share(static_cast<size_t>(stages), 1.0 / static_cast<double>(stages));
  if (!layer_weights.empty()) {
    double total = 0.0;
    for (double w : layer_weights) total += w;
    for (int64_t g = 0; g < stages; ++g) share[static_cast<size_t>(g)] = layer_weights[static_cast<size_t>(g)] / total;
  }
  const auto size = static_cast<size_t>(m * stages);
  c.fwd.resize(size);
  c.bwd.resize(size);
  c.wgt.assign(size, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < stages; ++g) {
      const auto k = static_cast<size_t>(i * stages + g);
      c.fwd[k] = mb_fwd[i] * share[static_cast<size_t>(g)];
      const double b = bwd_ratio * c.fwd[k];
      c.bwd[k] = split_weight ? b * (1.0 - weight_fraction) : b;
      if (split_weight) c.wgt[k] = b * weight_fraction;
    }
  return c;
}

SimResult simulate(const std::vector<std::vector<Op>>& orders, const StageCosts& c, int64_t pp, double p2p) {
  const int64_t S = c.stages;
  const auto size = static_cast<size_t>(c.m * S);
  std::vector<double> done_f(size, -1.0), done_b(size, -1.0), done_w(size, -1.0);
  std::vector<double> clock(static_cast<size_t>(pp), 0.0);
  std::vector<size_t> next(static_cast<size_t>(pp), 0);
  SimResult out;
  out.busy.assign(static_cast<size_t>(pp), 0.0);
  size_t total = 0, finished = 0;
  for (const auto& o : orders) total += o.size();
  auto hop = [&](int64_t g, int64_t h) { return (g % pp) == (h % pp) ? 0.0 : p2p; };
  while (finished < total) {
    bool progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      const auto& ops = orders[static_cast<size_t>(r)];
      auto& i = next[static_cast<size_t>(r)];
      while (i < ops.size()) {
        const Op& op = ops[i];
        const auto k = static_cast<size_t>(op.mb * S + op.stage);
        double ready = 0.0, cost = 0.0;
        if (op.kind == kForward) {
          if (op.stage > 0) {
            if (done_f[k - 1] < 0) break;
            ready = done_f[k - 1] + hop(op.stage - 1, op.stage);
          }
          cost = c.fwd[k];
        } else if (op.kind == kBackward) {
          if (done_f[k] < 0) break;
          ready = done_f[k];
          if (op.stage < S - 1) {
            if (done_b[k + 1] < 0) break;
            ready = std::max(ready, done_b[k + 1] + hop(op.stage + 1, op.stage));
          }
          cost = c.bwd[k];
        } else {
          if (done_b[k] < 0) break;
          ready = done_b[k];
          cost = c.wgt[k];
        }
        const double end = std::max(clock[static_cast<size_t>(r)], ready) + cost;
        (op.kind == kForward ? done_f : op.kind == kBackward ? done_b : done_w)[k] = end;
        clock[static_cast<size_t>(r)] = end;
        out.busy[static_cast<size_t>(r)] += cost;
        ++i;
        ++finished;
        progress = true;
      }
    }
    if (!progress) throw std::invalid_argument("pipeline order deadlocks: an op waits on one that never runs");
  }
  for (double t : clock) out.makespan = std::max(out.makespan, t);
  out.lower_bound = lower_bound(c, pp, std::any_of(c.wgt.begin(), c.wgt.end(), [](double w) { return w > 0; }), p2p);
  return out;
}

double lower_bound(const StageCosts& c, int64_t pp, bool split_weight, double p2p) {
  const int64_t S = c.stages, m = c.m;
  if (m == 0) return 0.0;
  const double hop = pp > 1 ? p2p : 0.0;
  double bound = 0.0;
  for (int64_t i = 0; i < m; ++i) {  // a micro-batch's path: forward down every stage, backward back up
    double path = 0.0;
    for (int64_t g = 0; g < S; ++g) path += c.fwd[static_cast<size_t>(i * S + g)] + c.bwd[static_cast<size_t>(i * S + g)];
    if (split_weight) path += c.wgt[static_cast<size_t>(i * S)];
    bound = std::max(bound, path + 2.0 * static_cast<double>(S - 1) * hop);
  }
  for (int64_t r = 0; r < std::min(pp, S); ++r) {  // a rank: its first input's way in, its work, its last output's way out
    double work = 0.0, head = -1.0, tail = -1.0;
    for (int64_t i = 0; i < m; ++i) {
      double f_in = 0.0, b_out = 0.0;
      for (int64_t g = 0; g < S; ++g) {
        const auto k = static_cast<size_t>(i * S + g);
        if (g % pp == r) work += c.fwd[k] + c.bwd[k] + c.wgt[k];
        if (g < r) f_in += c.fwd[k], b_out += c.bwd[k];
      }
      head = head < 0 ? f_in : std::min(head, f_in);
      tail = tail < 0 ? b_out : std::min(tail, b_out);
    }
    const double hops = static_cast<double>(r) * hop;
    bound = std::max(bound, head + hops + work + (split_weight ? 0.0 : tail + hops));
  }
  return bound;
}

int64_t valid_microbatches(Schedule schedule, int64_t pp, int64_t v, int64_t group, int64_t at_least) {
  for (int64_t m = std::max<int64_t>(1, at_least);; ++m)
    if (microbatch_rule(schedule, pp, v, group, m).empty()) return m;
}

std::string microbatch_rule(Schedule schedule, int64_t pp, int64_t v, int64_t group, int64_t m) {
  if (m < 1) return "must be >= 1";
  if (schedule == Schedule::OneFOneB && m < pp)
    return "must be >= pp_size (" + std::to_string(pp) + ") under Schedule1F1B";
  if (schedule == Schedule::Interleaved || schedule == Schedule::ZeroBubble) {
    const int64_t rounds = std::max<int64_t>(1, m / pp);
    if (m % rounds != 0)
      return "must be a multiple of its number of rounds max(1, m // pp_size) = " + std::to_string(rounds) +
             " (torch's interleaved schedules)";
    if (m % group != 0) return "must be a multiple of microbatch_group (" + std::to_string(group) + ")";
  }
  (void)v;
  return "";
}

}  // namespace pipeline
}  // namespace packkit
