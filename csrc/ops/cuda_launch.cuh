// What every packkit CUDA op does around a launch: take the current stream of the tensor's device through the
// stable C shim (never the default stream, never a sync, so it orders with the caller's work and CUDA graphs
// capture it), and turn a failed launch into an error naming the op.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

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

// A kernel reads an int32 / int64 tensor through a typed pointer, which faults (misaligned address, and the CUDA
// context is lost) when the data is not aligned to its element size: torch's allocator never does that, external
// memory (DLPack, a byte-offset view) may. Refused on the host with the tensor's name.
inline void check_aligned(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, t] : tensors) {
    if (t->numel() == 0) continue;
    const auto address = reinterpret_cast<uintptr_t>(t->const_data_ptr());
    STD_TORCH_CHECK(address % t->element_size() == 0, "packkit::", op, ": ", name, "'s data (at address ", address,
                    ") is not aligned to its ", t->element_size(), "-byte elements; pass a copy (.clone())");
  }
}

inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, "packkit::", op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace packkit::ops
