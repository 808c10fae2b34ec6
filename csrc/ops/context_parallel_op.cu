// CUDA implementation of packkit::cp_shard (semantics: tests/cp_reference.py; index math shared with
// the CPU op in context_parallel.hpp). One kernel, one launch on the current stream: each thread owns
// output positions, binary-searches its segment in the padded (zigzag) or plain (contiguous)
// cu_seqlens and gathers input_ids, labels, position_ids and the next label of the same segment; in the
// fused mode (seg_src) it reads them straight from the unpacked source (pack + pad + split in one launch). Nothing is
// read back to the host; out_len comes from the caller. Host checks are metadata only; every device
// index is bounded (context_parallel.hpp), so inconsistent cu_seqlens give padding, never a fault.
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

#include "context_parallel.hpp"
#include "cuda_launch.cuh"
#include "launch_sizes.hpp"
#include "ops.hpp"
#include "pack_checks.hpp"

namespace packkit::ops {
namespace {

constexpr int kCpThreads = 256;

template <typename Id, typename Label>
__global__ void cp_shard_kernel(const Id* __restrict__ ids, const Label* __restrict__ labels,
                                const int64_t* __restrict__ pos, const int32_t* __restrict__ cu,
                                const int32_t* __restrict__ cu_padded, int64_t num_segments, int64_t num_tokens,
                                int64_t cp_size, int64_t cp_rank, bool zigzag, int64_t out_len, int64_t pad_id,
                                int64_t ignore_index, const int64_t* __restrict__ seg_src, int64_t num_src,
                                int64_t position_start, bool has_first, int64_t first_label,
                                Id* __restrict__ out_ids, Label* __restrict__ out_split,
                                Label* __restrict__ out_labels,
                                int64_t* __restrict__ out_pos, int64_t* __restrict__ out_src,
                                int32_t* __restrict__ out_seg) {
  // Fused (seg_src != nullptr): the packed row's length is cu[S], read here on the device (no host sync).
  if (seg_src != nullptr) num_tokens = num_segments >= 0 ? int64_t{cu[num_segments]} : 0;
  const Label ignore = static_cast<Label>(ignore_index);
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < out_len;
       j += int64_t{gridDim.x} * blockDim.x) {
    const cp::Source w = cp::locate(j, cu, cu_padded, num_segments, num_tokens, cp_size, cp_rank, zigzag, out_len);
    out_src[j] = w.src;
    out_seg[j] = static_cast<int32_t>(w.seg);
    const bool in_seg = w.seg < num_segments;
    const int64_t begin = in_seg ? int64_t{cu[w.seg]} : num_tokens;
    const int64_t end = in_seg ? int64_t{cu[w.seg + 1]} : num_tokens;
    if (w.src >= 0 && seg_src == nullptr) {
      out_ids[j] = ids[w.src];
      out_split[j] = labels[w.src];
      out_pos[j] = pos[w.src];
      out_labels[j] = (w.src + 1 < end && w.src + 1 < num_tokens) ? labels[w.src + 1] : ignore;
    } else if (w.src >= 0) {
      const int64_t o = w.src - begin;  // offset in the segment
      const int64_t from = in_seg ? seg_src[w.seg] : -1;
      // The token in the unpacked source. Every term is bounded before the read: with inconsistent
      // cu_seqlens (say starting at 5) the row position lies before its segment (o < 0) and from + o
      // would read before input_ids; a huge seg_src must not wrap either.
      const bool inside = from >= 0 && o >= 0 && o < end - begin && from < num_src && o < num_src - from;
      const int64_t q = inside ? from + o : -1;
      out_pos[j] = position_start + o;
      if (inside) {
        out_ids[j] = ids[q];
        out_split[j] = (o == 0 && has_first) ? static_cast<Label>(first_label) : labels[q];
        out_labels[j] = (w.src + 1 < end && q + 1 < num_src) ? labels[q + 1] : ignore;
      } else {  // a padding segment of the packed row (or an inconsistent seg_src: padding, never a fault)
        out_ids[j] = static_cast<Id>(pad_id);
        out_split[j] = ignore;
        out_labels[j] = ignore;
      }
    } else {
      out_ids[j] = static_cast<Id>(pad_id);
      out_split[j] = ignore;
      out_labels[j] = ignore;
      int64_t base = 0;
      if (in_seg) {
        const int64_t last = end - 1;
        if (last >= begin && last >= 0 && last < num_tokens) {
          base = seg_src == nullptr ? pos[last] + 1 : position_start + (end - begin);
        }
      }
      out_pos[j] = base + w.pad_pos;
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cp_shard_cuda(
    const Tensor& input_ids, const Tensor& labels, const std::optional<Tensor>& position_ids, const Tensor& cu_seqlens,
    const Tensor& cu_seqlens_padded, int64_t cp_size, int64_t cp_rank, bool zigzag, int64_t out_len, int64_t pad_id,
    int64_t ignore_index, const std::optional<Tensor>& seg_src, int64_t position_start,
    std::optional<int64_t> first_label) {
  check_cp_shard_args(input_ids, labels, position_ids, cu_seqlens, cu_seqlens_padded, cp_size, cp_rank, out_len,
                      seg_src, first_label);
  STD_TORCH_CHECK(input_ids.is_cuda(), "packkit::cp_shard: inputs must be CUDA tensors here");
  // The tensors' device, not the current one: its stream, its allocations, its launch.
  torch::stable::accelerator::DeviceGuard guard(input_ids.get_device_index());
  check_aligned("cp_shard", {{"input_ids", &input_ids}, {"labels", &labels}, {"cu_seqlens", &cu_seqlens},
                             {"cu_seqlens_padded", &cu_seqlens_padded}});
  if (position_ids) check_aligned("cp_shard", {{"position_ids", &*position_ids}});
  if (seg_src) check_aligned("cp_shard", {{"seg_src", &*seg_src}});
  const CpShardOutputs out(input_ids, labels, out_len);
  if (out_len == 0) return out.tuple();
  const int64_t num_segments = cu_seqlens.numel() - 1;
  const int64_t num_tokens = input_ids.numel();
  const int64_t blocks = launch::strided(out_len, kCpThreads, 65535);  // a grid-stride loop covers the rest
  cudaStream_t stream = current_stream(input_ids);
  dispatch_cp_shard_types(input_ids, labels, [&](auto id_tag, auto label_tag) {
    using Id = decltype(id_tag);
    using Label = decltype(label_tag);
    cp_shard_kernel<Id, Label><<<static_cast<unsigned>(blocks), kCpThreads, 0, stream>>>(
        input_ids.const_data_ptr<Id>(), labels.const_data_ptr<Label>(),
        position_ids ? position_ids->const_data_ptr<int64_t>() : nullptr, cu_seqlens.const_data_ptr<int32_t>(),
        cu_seqlens_padded.const_data_ptr<int32_t>(), num_segments, num_tokens, cp_size, cp_rank, zigzag, out_len,
        pad_id, ignore_index, seg_src ? seg_src->const_data_ptr<int64_t>() : nullptr, input_ids.numel(),
        position_start, first_label.has_value(), first_label.value_or(0), out.ids.mutable_data_ptr<Id>(),
        out.split.mutable_data_ptr<Label>(), out.labels.mutable_data_ptr<Label>(), out.pos.mutable_data_ptr<int64_t>(),
        out.src.mutable_data_ptr<int64_t>(), out.seg.mutable_data_ptr<int32_t>());
  });
  check_launch("cp_shard");
  return out.tuple();
}

}  // namespace packkit::ops

STABLE_TORCH_LIBRARY_IMPL(packkit, CUDA, m) {
  m.impl("cp_shard", TORCH_BOX(&packkit::ops::cp_shard_cuda));
}
