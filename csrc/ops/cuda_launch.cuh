// What every packkit CUDA op does around a launch: take the current stream of the tensor's device through the
// stable C shim (never the default stream, never a sync, so it orders with the caller's work and CUDA graphs
// capture it), and turn a failed launch into an error naming the op.
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

inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, "packkit::", op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace packkit::ops
