// Every packkit op schema, defined once, each beside the kernels that implement it.
// Built against the LibTorch stable ABI (TORCH_TARGET_VERSION = 2.10): one binary for torch >= 2.10.
#include <torch/csrc/stable/library.h>

#include "ops/ops.hpp"

STABLE_TORCH_LIBRARY(packkit, m) {
  // Bin-packing plan of `lengths` into rows of `capacity`, as CSR: segments (source sequence,
  // start, length) in row order, and bin_offsets [num_bins + 1]. Output sizes depend on the data.
  m.def(
      "plan(Tensor lengths, int capacity, str algorithm=\"obfd\", str overlong=\"error\", int dp_size=1, "
      "float cost_a=1.0, float cost_b=0.0) -> (Tensor seg_seq, Tensor seg_start, Tensor seg_length, "
      "Tensor bin_offsets)");
}

STABLE_TORCH_LIBRARY_IMPL(packkit, CPU, m) {
  m.impl("plan", TORCH_BOX(&packkit::ops::plan_cpu));
}
