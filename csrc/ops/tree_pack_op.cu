// CUDA implementation of packkit::tree_pack (semantics: tests/tree_pack_reference.py; index math shared with the
// CPU op in tree_pack.hpp). One kernel, one launch on the current stream: each thread owns output tokens (a binary
// search of its node among its row's nodes) and, past the last token, cu_seqlens entries. Nothing is read back to
// the host: the sizes come from the caller. Host checks are metadata only; every device read is bounded (node
// indices clamped to the row's CSR range, source reads checked), so an inconsistent layout gives padding values,
// never a fault.
#include <cuda_runtime.h>

#ifndef USE_CUDA
#define USE_CUDA
#endif

#include <optional>
#include <tuple>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include "cuda_launch.cuh"
#include "launch_sizes.hpp"
#include "ops.hpp"
#include "pack_checks.hpp"
#include "tree_pack.hpp"

namespace packkit::ops {
namespace {

constexpr int kTreeThreads = 256;

template <typename Id, typename Label>
__global__ void tree_pack_kernel(const Id* __restrict__ ids, const Label* __restrict__ labels, int64_t num_src,
                                 const int64_t* __restrict__ src, const int64_t* __restrict__ dst,
                                 const int64_t* __restrict__ len, const int64_t* __restrict__ npos,
                                 const int64_t* __restrict__ nend, const int64_t* __restrict__ row_offsets, int64_t m,
                                 int64_t num_rows, int64_t row_len, int64_t pad_id, int64_t ignore_index,
                                 Id* __restrict__ out_ids, Label* __restrict__ out_labels, int64_t* __restrict__ out_pos,
                                 int32_t* __restrict__ out_node, int32_t* __restrict__ out_end,
                                 int32_t* __restrict__ cu) {
  const int64_t total = num_rows * row_len;
  const int64_t work = total + m + num_rows + 1;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < work; j += int64_t{gridDim.x} * blockDim.x) {
    if (j >= total) {  // a cu_seqlens entry
      const int64_t e = j - total;
      cu[e] = static_cast<int32_t>(tree::cu_entry(e, row_offsets, dst, len, m, num_rows, row_len));
      continue;
    }
    const int64_t r = j / row_len;
    const tree::Range nodes = tree::row_nodes(row_offsets, r, m);
    const int64_t i = tree::last_at_most(nodes.lo, nodes.hi, j, [&](int64_t k) { return dst[k]; });
    const int64_t o = i >= nodes.lo ? j - dst[i] : -1;
    // src[i] + o in unsigned arithmetic: a huge node_src wraps out of range instead of overflowing.
    const uint64_t q64 = static_cast<uint64_t>(src[i]) + static_cast<uint64_t>(o);
    const int64_t q = o >= 0 && o < len[i] && q64 < static_cast<uint64_t>(num_src) ? static_cast<int64_t>(q64) : -1;
    if (q >= 0 && q < num_src) {
      out_ids[j] = ids[q];
      out_labels[j] = labels[q];
      out_pos[j] = npos[i] + o;
      out_node[j] = static_cast<int32_t>(i);
      out_end[j] = static_cast<int32_t>(nend[i]);
    } else {  // the row's padding tail: positions count from its start
      const int64_t tail = nodes.hi > nodes.lo ? dst[nodes.hi - 1] + len[nodes.hi - 1] : r * row_len;
      out_ids[j] = static_cast<Id>(pad_id);
      out_labels[j] = static_cast<Label>(ignore_index);
      out_pos[j] = j >= tail ? j - tail : 0;
      out_node[j] = -1;
      out_end[j] = static_cast<int32_t>(row_len);
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> tree_pack_cuda(
    const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& node_src, const Tensor& node_dst,
    const Tensor& node_len, const Tensor& node_pos, const Tensor& node_end, const Tensor& row_offsets,
    int64_t num_rows, int64_t row_len, int64_t pad_id, int64_t ignore_index) {
  check_tree_pack_args(input_ids, labels, node_src, node_dst, node_len, node_pos, node_end, row_offsets, num_rows,
                       row_len);
  STD_TORCH_CHECK(input_ids.is_cuda(), "packkit::tree_pack: inputs must be CUDA tensors here");
  // The tensors' device, not the current one: its stream, its allocations, its launch.
  torch::stable::accelerator::DeviceGuard guard(input_ids.get_device_index());
  const Tensor& label_src = labels.has_value() ? *labels : input_ids;
  check_aligned("tree_pack", {{"input_ids", &input_ids}, {"labels", &label_src}, {"node_src", &node_src},
                              {"node_dst", &node_dst}, {"node_len", &node_len}, {"node_pos", &node_pos},
                              {"node_end", &node_end}, {"row_offsets", &row_offsets}});
  const int64_t m = node_src.numel();
  const TreePackOutputs out(input_ids, label_src, num_rows, row_len, m);
  const int64_t work = num_rows * row_len + m + num_rows + 1;
  const int64_t blocks = launch::strided(work, kTreeThreads, 65535);  // a grid-stride loop covers the rest
  cudaStream_t stream = current_stream(input_ids);
  dispatch_tree_pack_types(input_ids, label_src, [&](auto id_tag, auto label_tag) {
    using Id = decltype(id_tag);
    using Label = decltype(label_tag);
    tree_pack_kernel<Id, Label><<<static_cast<unsigned>(blocks), kTreeThreads, 0, stream>>>(
        input_ids.const_data_ptr<Id>(), label_src.const_data_ptr<Label>(), input_ids.numel(),
        node_src.const_data_ptr<int64_t>(), node_dst.const_data_ptr<int64_t>(), node_len.const_data_ptr<int64_t>(),
        node_pos.const_data_ptr<int64_t>(), node_end.const_data_ptr<int64_t>(), row_offsets.const_data_ptr<int64_t>(),
        m, num_rows, row_len, pad_id, ignore_index, out.ids.mutable_data_ptr<Id>(),
        out.labels.mutable_data_ptr<Label>(), out.pos.mutable_data_ptr<int64_t>(), out.node.mutable_data_ptr<int32_t>(),
        out.end.mutable_data_ptr<int32_t>(), out.cu.mutable_data_ptr<int32_t>());
  });
  check_launch("tree_pack");
  return out.tuple();
}

}  // namespace packkit::ops

STABLE_TORCH_LIBRARY_IMPL(packkit, CUDA, m) {
  m.impl("tree_pack", TORCH_BOX(&packkit::ops::tree_pack_cuda));
}
