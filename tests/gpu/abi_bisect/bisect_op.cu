// The stable-ABI bisect (issue 48): tiny ops, each using ONE facility of what packkit's CUDA op host code
// (csrc/ops/pack_op.cu, cuda_launch.cuh, context_parallel_op.cu) does, in the order pack_cuda / pack_batch_cuda do
// it. tests/gpu/abi_bisect/run_bisect.py calls each in its own child process, so the first one that kills the
// process names the line of packkit that does. Built like packkit's ops: TORCH_TARGET_VERSION 2.10; with nvcc
// (USE_CUDA, a kernel launch, registered for the CUDA key, as _ops_cuda.so) on a GPU machine, or as C++
// (-x c++, CPU key) on the CPU, where the device-only steps are absent.
//
// Test-only seam: PACKKIT_BISECT_PLANT=<step>[,<step>:hang] makes a step dereference null (or sleep forever) before
// its facility: the runner must report it as crashed (or timeout) and go on with the next steps.
#ifdef __CUDACC__
#include <cuda_runtime.h>
#ifndef USE_CUDA
#define USE_CUDA  // the shim declares aoti_torch_get_current_cuda_stream only under USE_CUDA (as pack_op.cu)
#endif
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// The guard every CUDA entry takes; the CPU build has no accelerator to guard (device_guard is device-only).
#ifdef __CUDACC__
#define PACKKIT_BISECT_GUARD(t) torch::stable::accelerator::DeviceGuard guard((t).get_device_index())
#else
#define PACKKIT_BISECT_GUARD(t) (void)(t)
#endif

namespace {

void plant(const char* step) {
  const char* planted = std::getenv("PACKKIT_BISECT_PLANT");  // "step[:hang],step[:hang],..."
  if (planted == nullptr) return;
  const std::string list = std::string(",") + planted + ",", name(step);
  if (list.find("," + name + ",") != std::string::npos) {
    volatile int* null = nullptr;
    *null = 1;  // SIGSEGV on purpose (the runner's control)
  }
  if (list.find("," + name + ":hang,") != std::string::npos) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // a hang on purpose (timeout verdict)
  }
}

// --- argument unboxing (every op's first act: the dispatcher's stack into C++ values) ---------------------
Tensor echo_arg(const Tensor& t) {  // returns its input: the smallest round trip
  plant("unbox_tensor");
  return t;
}

void unbox_tensor(const Tensor& t) { plant("unbox_tensor"); }

void unbox_scalars(const Tensor& t, int64_t n, double x, bool flag) {
  plant("unbox_scalars");
  STD_TORCH_CHECK(n == 7 && x == 0.5 && flag, "packkit_bisect::unbox_scalars: got ", n, ", ", x, ", ", flag);
}

void unbox_optionals(const Tensor& t, const std::optional<Tensor>& labels, std::optional<double> first_value,
                     std::optional<int64_t> first_label) {
  plant("unbox_optionals");
  STD_TORCH_CHECK(labels.has_value() && !first_value.has_value() && first_label.value_or(-1) == 3,
                  "packkit_bisect::unbox_optionals: wrong optionals");
}

void unbox_string(const Tensor& t, std::string algorithm) {
  plant("unbox_string");
  STD_TORCH_CHECK(algorithm == "obfd", "packkit_bisect::unbox_string: got '", algorithm, "'");
}

// --- tensor metadata (check_cuda, check_index_tensor, packed_shape, check_aligned) --------------------------
void tensor_queries(const Tensor& t) {
  plant("tensor_queries");
  const bool on_device = t.is_cuda();
  const auto index = t.get_device_index();
  STD_TORCH_CHECK(t.dim() == 1 && t.numel() == 8 && t.scalar_type() == ScalarType::Long && t.element_size() == 8,
                  "packkit_bisect::tensor_queries: wrong metadata");
  STD_TORCH_CHECK(t.size(0) == 8 && t.stride(0) == 1 && t.is_contiguous(), "packkit_bisect::tensor_queries: layout");
  STD_TORCH_CHECK(t.const_data_ptr() != nullptr, "packkit_bisect::tensor_queries: null data");
  STD_TORCH_CHECK(on_device == (index >= 0), "packkit_bisect::tensor_queries: is_cuda ", on_device, " index ", index);
}

// --- DeviceGuard on the tensors' device (every CUDA entry, before allocating or launching) ------------------
#ifdef __CUDACC__
void device_guard(const Tensor& t) {
  plant("device_guard");
  torch::stable::accelerator::DeviceGuard guard(t.get_device_index());
}
#endif

// --- torch::stable::contiguous under the guard (pack_cuda_impl's first act) -------------------------------
Tensor contiguous(const Tensor& t) {
  plant("contiguous");
  PACKKIT_BISECT_GUARD(t);
  return torch::stable::contiguous(t);
}

// --- allocation on the tensors' device (pack_cuda: new_empty(src, shape); pack_batch: with a dtype) -------
void new_empty(const Tensor& t) {
  plant("new_empty");
  PACKKIT_BISECT_GUARD(t);
  Tensor same = torch::stable::new_empty(t, {2, 4});
  Tensor ints = torch::stable::new_empty(t, {5}, ScalarType::Int);
  STD_TORCH_CHECK(same.numel() == 8 && ints.scalar_type() == ScalarType::Int &&
                      ints.get_device_index() == t.get_device_index(), "packkit_bisect::new_empty: wrong result");
}

void empty(const Tensor& t) {
  plant("empty");
  PACKKIT_BISECT_GUARD(t);
  Tensor out = torch::stable::empty({3}, ScalarType::Long, std::nullopt, t.device());
  STD_TORCH_CHECK(out.numel() == 3 && out.get_device_index() == t.get_device_index(), "packkit_bisect::empty: wrong");
}

// --- zero_ / fill_ (dispatcher calls back into aten from inside an op) ---------------------------------------
Tensor fill(const Tensor& t) {
  plant("fill");
  PACKKIT_BISECT_GUARD(t);
  Tensor out = torch::stable::new_empty(t, {4});
  torch::stable::zero_(out);
  torch::stable::fill_(out, 5.0);
  return out;
}

// --- returning tensors (every functional op; pack_batch / cp_shard return tuples) ---------------------------
Tensor return_tensor(const Tensor& t) {
  plant("return_tensor");
  PACKKIT_BISECT_GUARD(t);
  Tensor out = torch::stable::new_empty(t, {3}, ScalarType::Int);
  torch::stable::fill_(out, 2.0);
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> return_tuple(const Tensor& t) {
  plant("return_tuple");
  PACKKIT_BISECT_GUARD(t);
  Tensor ids = torch::stable::new_empty(t, {2});
  Tensor lab = torch::stable::new_empty(t, {2});
  Tensor pos = torch::stable::new_empty(t, {2}, ScalarType::Long);
  Tensor seq = torch::stable::new_empty(t, {2}, ScalarType::Int);
  Tensor cu = torch::stable::new_empty(t, {3}, ScalarType::Int);
  for (Tensor* x : {&ids, &lab, &pos, &seq, &cu}) torch::stable::fill_(*x, 1.0);
  return {ids, lab, pos, seq, cu};
}

// --- exceptions (every check; the first GPU run crashed on each) --------------------------------------------
void throw_plain(const Tensor& t) {
  plant("throw_plain");
  STD_TORCH_CHECK(false, "packkit_bisect::throw_plain: thrown on purpose");
}

Tensor throw_after_alloc(const Tensor& t) {  // unwinding releases a DeviceGuard and live tensor handles
  plant("throw_after_alloc");
  PACKKIT_BISECT_GUARD(t);
  Tensor out = torch::stable::new_empty(t, {4});
  STD_TORCH_CHECK(false, "packkit_bisect::throw_after_alloc: thrown on purpose");
  return out;
}

#ifdef __CUDACC__
// --- the current stream (cuda_launch.cuh current_stream, then torch::stable::accelerator's) -----------------
cudaStream_t current_stream(const Tensor& t) {  // as packkit::ops::current_stream
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "packkit_bisect: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

void stream(const Tensor& t) {
  plant("stream");
  PACKKIT_BISECT_GUARD(t);
  (void)current_stream(t);
}

void stream_stable(const Tensor& t) {
  plant("stream_stable");
  PACKKIT_BISECT_GUARD(t);
  (void)torch::stable::accelerator::getCurrentStream(t.get_device_index());
}

__global__ void iota_kernel(int64_t* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = i;
}

void check_launch(const char* op) {  // as packkit::ops::check_launch
  const cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, "packkit_bisect::", op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

// --- a kernel on that stream, writing a tensor allocated under the guard (launch_pack + check_launch) ------
Tensor kernel(const Tensor& t) {
  plant("kernel");
  PACKKIT_BISECT_GUARD(t);
  Tensor out = torch::stable::new_empty(t, {1000}, ScalarType::Long);
  cudaStream_t s = current_stream(t);
  iota_kernel<<<4, 256, 0, s>>>(static_cast<int64_t*>(out.mutable_data_ptr()), out.numel());
  check_launch("kernel");
  return out;
}

// --- a launch the device refuses (block too large, as layout_kernel's 1,024 x 88 registers was): must raise --
Tensor launch_fail(const Tensor& t) {
  plant("launch_fail");
  PACKKIT_BISECT_GUARD(t);
  Tensor out = torch::stable::new_empty(t, {4}, ScalarType::Long);
  iota_kernel<<<1, 4096, 0, current_stream(t)>>>(static_cast<int64_t*>(out.mutable_data_ptr()), out.numel());
  check_launch("launch_fail");
  return out;
}
#endif

}  // namespace

STABLE_TORCH_LIBRARY(packkit_bisect, m) {
  m.def("echo_arg(Tensor t) -> Tensor");
  m.def("unbox_tensor(Tensor t) -> ()");
  m.def("unbox_scalars(Tensor t, int n, float x, bool flag) -> ()");
  m.def("unbox_optionals(Tensor t, Tensor? labels, float? first_value, int? first_label) -> ()");
  m.def("unbox_string(Tensor t, str algorithm=\"obfd\") -> ()");
  m.def("tensor_queries(Tensor t) -> ()");
  m.def("device_guard(Tensor t) -> ()");
  m.def("contiguous(Tensor t) -> Tensor");
  m.def("new_empty(Tensor t) -> ()");
  m.def("empty(Tensor t) -> ()");
  m.def("fill(Tensor t) -> Tensor");
  m.def("return_tensor(Tensor t) -> Tensor");
  m.def("return_tuple(Tensor t) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("throw_plain(Tensor t) -> ()");
  m.def("throw_after_alloc(Tensor t) -> Tensor");
  m.def("stream(Tensor t) -> ()");
  m.def("stream_stable(Tensor t) -> ()");
  m.def("kernel(Tensor t) -> Tensor");
  m.def("launch_fail(Tensor t) -> Tensor");
}

#ifdef __CUDACC__
#define PACKKIT_BISECT_KEY CUDA  // as _ops_cuda.so registers packkit's CUDA kernels
#else
#define PACKKIT_BISECT_KEY CPU
#endif

STABLE_TORCH_LIBRARY_IMPL(packkit_bisect, PACKKIT_BISECT_KEY, m) {
  m.impl("echo_arg", TORCH_BOX(&echo_arg));
  m.impl("unbox_tensor", TORCH_BOX(&unbox_tensor));
  m.impl("unbox_scalars", TORCH_BOX(&unbox_scalars));
  m.impl("unbox_optionals", TORCH_BOX(&unbox_optionals));
  m.impl("unbox_string", TORCH_BOX(&unbox_string));
  m.impl("tensor_queries", TORCH_BOX(&tensor_queries));
  m.impl("contiguous", TORCH_BOX(&contiguous));
  m.impl("new_empty", TORCH_BOX(&new_empty));
  m.impl("empty", TORCH_BOX(&empty));
  m.impl("fill", TORCH_BOX(&fill));
  m.impl("return_tensor", TORCH_BOX(&return_tensor));
  m.impl("return_tuple", TORCH_BOX(&return_tuple));
  m.impl("throw_plain", TORCH_BOX(&throw_plain));
  m.impl("throw_after_alloc", TORCH_BOX(&throw_after_alloc));
#ifdef __CUDACC__
  m.impl("device_guard", TORCH_BOX(&device_guard));
  m.impl("stream", TORCH_BOX(&stream));
  m.impl("stream_stable", TORCH_BOX(&stream_stable));
  m.impl("kernel", TORCH_BOX(&kernel));
  m.impl("launch_fail", TORCH_BOX(&launch_fail));
#endif
}
