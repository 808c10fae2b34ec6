// packkit::plan on tensors: the C++ planner behind torch.ops.packkit.plan. Host-side only
// (planning is branchy, sequential work); the device pack ops consume its CSR output.
#include <cstring>
#include <tuple>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include "../planner/planner.hpp"
#include "ops.hpp"

namespace packkit::ops {

using torch::stable::Tensor;

namespace {
template <typename Vector>
Tensor int64_tensor(const Vector& values) {
  Tensor out = torch::stable::empty({static_cast<int64_t>(values.size())}, torch::headeronly::ScalarType::Long);
  if (!values.empty()) std::memcpy(out.mutable_data_ptr(), values.data(), values.size() * sizeof(int64_t));
  return out;
}
}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> plan_cpu(const Tensor& lengths, int64_t capacity, std::string algorithm,
                                                    std::string overlong, int64_t dp_size, double cost_a,
                                                    double cost_b) {
  STD_TORCH_CHECK(lengths.dim() == 1, "packkit::plan: lengths must be 1-D, got ", lengths.dim(), " dims");
  STD_TORCH_CHECK(lengths.scalar_type() == torch::headeronly::ScalarType::Long,
                  "packkit::plan: lengths must be int64");
  const Tensor contiguous = torch::stable::contiguous(lengths);
  PlanOptions opts;
  opts.capacity = capacity;
  opts.dp_size = dp_size;
  opts.cost = {cost_a, cost_b};
  PlanResult result;
  try {
    opts.algorithm = parse_algorithm(algorithm);
    opts.overlong = parse_overlong(overlong);
    result = make_plan(contiguous.const_data_ptr<int64_t>(), contiguous.numel(), opts);
  } catch (const InvalidInput& e) {
    STD_TORCH_CHECK(false, "packkit::plan: ", e.what());
  }
  return {int64_tensor(result.seg_seq), int64_tensor(result.seg_start), int64_tensor(result.seg_length),
          int64_tensor(result.bin_offsets)};
}

}  // namespace packkit::ops
