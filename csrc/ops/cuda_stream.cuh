// The current CUDA stream of a tensor's device, through the stable C shim: every packkit kernel launches on it
// (never the default stream, never a sync), so it orders with the caller's work and CUDA graphs capture it.
#pragma once

#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>

#include "ops.hpp"

namespace packkit::ops {

inline cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "packkit: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

}  // namespace packkit::ops
