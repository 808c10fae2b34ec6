// Index math of packkit::cp_shard, shared by the CPU op (context_parallel_op.cpp) and the CUDA kernel
// (context_parallel_op.cu); the Triton kernel (triton_kernels/context_parallel.py) repeats it.
//
// A flat packed row of T tokens in S segments (cu_seqlens [S + 1], each document and each padding tail
// one segment) is split over cp ranks:
//   zigzag:     segment s is padded to P_s = cu_padded[s+1] - cu_padded[s], a multiple of 2*cp, and cut
//               into 2*cp chunks of c_s = P_s / (2*cp); rank r keeps chunks r and 2*cp-1-r of every
//               segment, in segment order. Output position j of rank r lies in segment s with
//               cu_padded[s] / cp <= j < cu_padded[s+1] / cp.
//   contiguous: the row is padded at its end to cp * out_len; rank r keeps [r*out_len, (r+1)*out_len).
//               The end padding is one extra segment (index S).
// For every output position: the source token (or -1 for CP padding), its segment, and for padding
// the offset past the segment's last real token (its position continues the segment's count).
//
// Fused mode (seg_src given; pack + pad + split in one pass): the "packed row" above is never built.
// input_ids/labels are the unpacked flat source, and seg_src int64 [S] says where packed segment s
// starts in it (-1 for a padding segment). The packed token at row position p of segment s is source
// token seg_src[s] + (p - cu[s]); positions are position_start + (p - cu[s]) (pack_batch's), a real
// segment's first unshifted label is first_label when given (pack_batch's mask_first_label / the
// collator's separator_id), and a padding segment reads pad_id / ignore_index. src_index stays the
// packed-row position p, so unshard_context_parallel puts outputs back in the packed row's order.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include <torch/csrc/stable/ops.h>

#include "pack_checks.hpp"

#if defined(__CUDACC__)
#define PACKKIT_HD __host__ __device__ __forceinline__
#else
#define PACKKIT_HD inline
#endif

namespace packkit::ops::cp {

// Last s in [0, n) with a[s] <= x (a[0] <= x); n >= 1. Always returns an index in [0, n).
template <typename T>
PACKKIT_HD int64_t segment_of(const T* a, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(a[mid]) <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct Source {
  int64_t src;      // source token in the packed row, -1 for CP padding
  int64_t seg;      // segment (S for contiguous end padding)
  int64_t pad_pos;  // padding only: position offset past the segment's last real token (0-based)
};

// num_tokens = cu[S]. Every read is bounded: inconsistent inputs give padding, never an out-of-range index.
PACKKIT_HD Source locate(int64_t j, const int32_t* cu, const int32_t* cu_padded, int64_t num_segments,
                         int64_t num_tokens, int64_t cp_size, int64_t cp_rank, bool zigzag, int64_t out_len) {
  Source out{-1, num_segments, 0};
  if (zigzag) {
    if (num_segments < 1) return out;
    const int64_t s = segment_of(cu_padded, num_segments, j * cp_size);
    const int64_t chunk = (static_cast<int64_t>(cu_padded[s + 1]) - cu_padded[s]) / (2 * cp_size);
    const int64_t k = j - cu_padded[s] / cp_size;
    const int64_t idx = k < chunk ? cp_rank * chunk + k : (2 * cp_size - 1 - cp_rank) * chunk + (k - chunk);
    const int64_t len = static_cast<int64_t>(cu[s + 1]) - cu[s];
    out.seg = s;
    if (idx >= 0 && idx < len && cu[s] + idx >= 0 && cu[s] + idx < num_tokens) {  // never before the row
      out.src = cu[s] + idx;
    } else {
      out.pad_pos = idx - len;
    }
    return out;
  }
  const int64_t g = cp_rank * out_len + j;
  if (g < num_tokens && num_segments >= 1) {
    out.src = g;
    out.seg = segment_of(cu, num_segments, g);
  } else {
    out.pad_pos = g - num_tokens;
  }
  return out;
}

}  // namespace packkit::ops::cp

namespace packkit::ops {

// Metadata checks shared by the CPU and CUDA ops (no data read, so no host sync on CUDA).
inline void check_cp_shard_args(const Tensor& input_ids, const Tensor& labels,
                                const std::optional<Tensor>& position_ids, const Tensor& cu_seqlens,
                                const Tensor& cu_seqlens_padded, int64_t cp_size, int64_t cp_rank, int64_t out_len,
                                const std::optional<Tensor>& seg_src, const std::optional<int64_t>& first_label) {
  const char* op = "cp_shard";
  STD_TORCH_CHECK(cp_size >= 1, "packkit::cp_shard: cp_size must be >= 1, got ", cp_size);
  STD_TORCH_CHECK(cp_rank >= 0 && cp_rank < cp_size, "packkit::cp_shard: cp_rank must be in [0, cp_size), got ",
                  cp_rank);
  STD_TORCH_CHECK(out_len >= 0 && out_len <= std::numeric_limits<int32_t>::max() / cp_size,
                  "packkit::cp_shard: out_len * cp_size must be in [0, 2^31), got out_len ", out_len);
  for (const Tensor* t : {&input_ids, &labels}) {
    STD_TORCH_CHECK(t->dim() == 1, "packkit::cp_shard: input_ids and labels must be flat 1-D");
    STD_TORCH_CHECK(t->scalar_type() == ScalarType::Long || t->scalar_type() == ScalarType::Int,
                    "packkit::cp_shard: input_ids and labels must be int64 or int32");
  }
  check_index_tensor(cu_seqlens, op, "cu_seqlens", ScalarType::Int);
  check_index_tensor(cu_seqlens_padded, op, "cu_seqlens_padded", ScalarType::Int);
  STD_TORCH_CHECK(labels.numel() == input_ids.numel(),
                  "packkit::cp_shard: input_ids and labels must have the same number of tokens");
  STD_TORCH_CHECK(cu_seqlens.numel() >= 1 && cu_seqlens_padded.numel() == cu_seqlens.numel(),
                  "packkit::cp_shard: cu_seqlens and cu_seqlens_padded must have the same length (>= 1)");
  if (seg_src.has_value()) {  // fused: positions come from the layout, not a packed position_ids
    STD_TORCH_CHECK(!position_ids.has_value(), "packkit::cp_shard: with seg_src (fused pack + shard) "
                    "position_ids must be None (positions are position_start + the offset in the segment)");
    check_index_tensor(*seg_src, op, "seg_src", ScalarType::Long);
    STD_TORCH_CHECK(seg_src->numel() == cu_seqlens.numel() - 1,
                    "packkit::cp_shard: seg_src needs one entry per segment of cu_seqlens (", cu_seqlens.numel() - 1,
                    "), got ", seg_src->numel());
  } else {
    STD_TORCH_CHECK(position_ids.has_value(), "packkit::cp_shard: position_ids is required without seg_src");
    STD_TORCH_CHECK(!first_label.has_value(), "packkit::cp_shard: first_label applies to the fused mode "
                    "(seg_src) only; a packed row already has its first labels");
    check_index_tensor(*position_ids, op, "position_ids", ScalarType::Long);
    STD_TORCH_CHECK(position_ids->numel() == input_ids.numel(),
                    "packkit::cp_shard: input_ids, labels and position_ids must have the same number of tokens");
  }
  for (const Tensor* t : {&labels, &cu_seqlens, &cu_seqlens_padded}) {
    check_same_device(input_ids, *t, op, "input_ids", "every input");
    STD_TORCH_CHECK(t->is_contiguous(), "packkit::cp_shard: inputs must be contiguous");
  }
  for (const std::optional<Tensor>* t : {&position_ids, &seg_src}) {
    if (!t->has_value()) continue;
    check_same_device(input_ids, **t, op, "input_ids", "every input");
    STD_TORCH_CHECK((*t)->is_contiguous(), "packkit::cp_shard: inputs must be contiguous");
  }
  STD_TORCH_CHECK(input_ids.is_contiguous(), "packkit::cp_shard: inputs must be contiguous");
}

// The op's six outputs, allocated and returned alike by the CPU and CUDA ops: ids and the two label
// tensors keep their inputs' dtypes, positions and the source index are int64, the segment int32.
struct CpShardOutputs {
  Tensor ids, split, labels, pos, src, seg;
  CpShardOutputs(const Tensor& input_ids, const Tensor& label_src, int64_t out_len)
      : ids(torch::stable::new_empty(input_ids, {out_len})),
        split(torch::stable::new_empty(label_src, {out_len})),
        labels(torch::stable::new_empty(label_src, {out_len})),
        pos(torch::stable::new_empty(input_ids, {out_len}, ScalarType::Long)),
        src(torch::stable::new_empty(input_ids, {out_len}, ScalarType::Long)),
        seg(torch::stable::new_empty(input_ids, {out_len}, ScalarType::Int)) {}
  std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> tuple() const { return {ids, split, labels, pos, src, seg}; }
};

// Calls f(Id{}, Label{}) with the element types of input_ids and labels (each int64 or int32, as checked
// by check_cp_shard_args): the one dtype switch of the CPU loop and the CUDA launch.
template <typename F>
void dispatch_cp_shard_types(const Tensor& input_ids, const Tensor& labels, F&& f) {
  const bool id64 = input_ids.scalar_type() == ScalarType::Long;
  const bool lab64 = labels.scalar_type() == ScalarType::Long;
  if (id64 && lab64) f(int64_t{}, int64_t{});
  else if (id64) f(int64_t{}, int32_t{});
  else if (lab64) f(int32_t{}, int64_t{});
  else f(int32_t{}, int32_t{});
}

}  // namespace packkit::ops
