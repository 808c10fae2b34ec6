// The smallest stable-ABI op that throws (TORCH_TARGET_VERSION 2.10, like packkit's ops): does a C++
// exception thrown in an extension reach Python as a RuntimeError with this machine's compiler and torch?
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

using torch::stable::Tensor;

Tensor echo(Tensor t) { return t; }

Tensor throw_now(Tensor t) {
  STD_TORCH_CHECK(false, "packkit_probe::throw_now: thrown on purpose");
  return t;
}

STABLE_TORCH_LIBRARY(packkit_probe, m) {
  m.def("echo(Tensor t) -> Tensor");
  m.def("throw_now(Tensor t) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(packkit_probe, CompositeExplicitAutograd, m) {
  m.impl("echo", TORCH_BOX(&echo));
  m.impl("throw_now", TORCH_BOX(&throw_now));
}
