// Declarations of every op implementation; schemas live in csrc/torch_bindings.cpp.
#pragma once
#include <string>
#include <tuple>

#include <torch/csrc/stable/tensor.h>

namespace packkit::ops {

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor> plan_cpu(
    const torch::stable::Tensor& lengths, int64_t capacity, std::string algorithm, std::string overlong,
    int64_t dp_size, double cost_a, double cost_b);

}  // namespace packkit::ops
