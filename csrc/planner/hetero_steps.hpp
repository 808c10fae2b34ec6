// Data-parallel steps over heterogeneous ranks (mixed GPUs): rank i's row holds at most capacity[i] tokens and runs
// at relative speed speed[i], so a row's time is its cost / speed[i]. What LightBinPack's ohgbfd does, balanced in
// time rather than in cost. Pure C++17 (no torch, no Python); used by make_plan for ogbfd with per-rank capacities.
#pragma once
#include <cstdint>
#include <vector>

#include "dp_layout.hpp"

namespace packkit {

// The tokens each rank's rows are filled to: min(capacity, speed * tau) with tau = min over ranks of capacity /
// speed, so full rows take the same time under a linear cost (more tokens on a slow rank would only make every step
// wait for it), but never below the longest item where the rank's capacity holds it (it must fit somewhere).
std::vector<int64_t> time_capacities(const std::vector<int64_t>& capacity, const std::vector<double>& speed,
                                     int64_t longest);

// Rows filled to time_capacities(capacity, speed, longest item). Longest items first, each into the step whose largest free row fits it most tightly (best fit across steps), and
// there into the row that finishes earliest with it (cost / speed, among rows with room); then, per step, items move
// or swap out of its slowest row while that lowers the step's time (never past a row's capacity). Step-major slots:
// slot s * ranks + i is rank i's row at step s. Every item lands in exactly one slot; lengths[i] <= max capacity.
Slots hetero_steps(const int64_t* lengths, int64_t n, const std::vector<double>& costs,
                   const std::vector<int64_t>& capacity, const std::vector<double>& speed);

}  // namespace packkit
