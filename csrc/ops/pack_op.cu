// CUDA implementations of the pack op family (semantics: tests/pack_reference.py).
//
// Two kernels do the work:
//   * layout_kernel (one block): scans the plan's segment lengths into cu_seqlens and cu_seg, adding
//     each row's padding tail as its own segment. One block is enough: it touches each segment once
//     and is small next to moving the tokens. Entries past the produced segments (a caller's
//     num_cu_seqlens larger than the plan's, which only check_plan can see) are empty padding segments
//     at the end (cu = the packed token count, cu_seg = -1), as the Triton kernel writes them; the CPU op,
//     which has the data, refuses such a call.
//   * the gather kernels: each block owns a tile of output positions; it finds the first and last
//     output segment of its tile in cu_seqlens once, then every thread binary-searches only that
//     short range for each of its positions and copies (or pads) one element. Writes are coalesced;
//     reads are contiguous within a segment.
// pack_batch = layout + one fused gather writing input_ids, labels, position_ids and seq_idx.
// Everything launches on the current stream; nothing reads device data back, and sizes come from
// ints the host computed from the plan.
//
// No input can make a kernel read or write outside its tensors: every index taken from plan data
// (bin offsets, segment indices, sequence indices, source rows) is bounds-checked before use, and an
// element whose source is out of range gets the padding value. An inconsistent plan therefore gives
// meaningless values but never an illegal address (which would poison the CUDA context and kill the
// job); packkit.check_plan detects it, on the device and without a host sync.
#include <cuda_runtime.h>

// The shim declares its CUDA entry points (current stream) only under USE_CUDA.
#ifndef USE_CUDA
#define USE_CUDA
#endif

#include <cub/block/block_scan.cuh>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include "cuda_launch.cuh"
#include "launch_sizes.hpp"
#include "ops.hpp"
#include "pack_checks.hpp"

namespace packkit::ops {
namespace {

// 512 with __launch_bounds__: the scan needs 88 registers per thread on sm_90 and 93 on sm_100 unbounded, so
// 1,024 threads (90,112 registers) could not launch; bounded to 512 threads ptxas fits it in 40 (sm_80),
// 64 (sm_90a) and 61 (sm_100) registers without spills (1,024 bounded: 64 with 272-304 bytes of spills).
// tools/check_cuda_resources.py checks registers x block for every kernel and architecture.
constexpr int kLayoutThreads = 512;
constexpr int kThreads = 256;
constexpr int kItems = 8;  // positions per thread per tile
constexpr int64_t kTile = int64_t{kThreads} * kItems;

void check_cuda(const Tensor& t, const char* op, const char* name) {
  STD_TORCH_CHECK(t.is_cuda(), "packkit::", op, ": ", name, " must be a CUDA tensor here");
}

// --- layout ------------------------------------------------------------------------------------
// Lengths of a consistent plan lie in [1, row_len]; clamping keeps bad ones from overflowing sums.
__device__ __forceinline__ int64_t bounded_length(int64_t length, int64_t row_len) {
  return min(max(length, int64_t{0}), row_len);
}

// cu[k] = total, cu_seg[k] = -1 for k in [produced, last], then cu[last] = total: every entry is written.
__device__ __forceinline__ void fill_rest(int32_t* __restrict__ cu, int32_t* __restrict__ cu_seg, int64_t produced,
                                          int64_t last, int64_t total) {
  for (int64_t k = max(produced, int64_t{0}) + threadIdx.x; k < last; k += blockDim.x) {
    cu[k] = static_cast<int32_t>(total);
    cu_seg[k] = -1;
  }
  if (threadIdx.x == 0) cu[last] = static_cast<int32_t>(total);
}

__global__ void __launch_bounds__(kLayoutThreads) layout_kernel(const int64_t* __restrict__ seg_length, const int64_t* __restrict__ bin_offsets,
                              int64_t num_bins, int64_t num_segments, int64_t num_rows, int64_t row_len, bool flat,
                              int32_t* __restrict__ cu, int32_t* __restrict__ cu_seg, int64_t num_cu) {
  using Scan = cub::BlockScan<int64_t, kLayoutThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t last = num_cu - 1;  // entries [0, last) belong to segments; cu[last] is the end
  int64_t carry = 0;                // output segments (padded) or tokens (flat) before this chunk
  if (flat) {
    constexpr int kPer = 4;
    for (int64_t base = 0; base < num_segments; base += int64_t{kLayoutThreads} * kPer) {
      const int64_t first = base + int64_t{threadIdx.x} * kPer;
      int64_t len[kPer];
      for (int i = 0; i < kPer; ++i) len[i] = first + i < num_segments ? bounded_length(seg_length[first + i], row_len) : 0;
      int64_t excl[kPer], aggregate;
      Scan(scan_storage).ExclusiveSum(len, excl, aggregate);
      for (int i = 0; i < kPer; ++i) {
        const int64_t j = first + i;
        if (j < num_segments && j < last) {
          cu[j] = static_cast<int32_t>(carry + excl[i]);
          cu_seg[j] = static_cast<int32_t>(j);
        }
      }
      carry += aggregate;
      __syncthreads();  // scan_storage is reused by the next chunk
    }
    const bool pad = carry < row_len;
    if (threadIdx.x == 0 && pad && num_segments < last) {
      cu[num_segments] = static_cast<int32_t>(carry);
      cu_seg[num_segments] = -1;
    }
    fill_rest(cu, cu_seg, num_segments + (pad ? 1 : 0), last, row_len);
    return;
  }
  for (int64_t base = 0; base < num_rows; base += kLayoutThreads) {
    const int64_t b = base + threadIdx.x;
    int64_t first = 0, count = 0, tokens = 0;
    if (b < num_rows && b < num_bins) {
      // Clamped into [0, num_segments]: a bad offset must not walk past seg_length.
      first = min(max(bin_offsets[b], int64_t{0}), num_segments);
      count = min(max(bin_offsets[b + 1], first), num_segments) - first;
      for (int64_t j = first; j < first + count; ++j) tokens += bounded_length(seg_length[j], row_len);
    }
    const bool pad = b < num_rows && tokens < row_len;
    int64_t k, aggregate;
    Scan(scan_storage).ExclusiveSum(count + (pad ? 1 : 0), k, aggregate);
    k += carry;
    int64_t pos = b * row_len;
    for (int64_t j = first; j < first + count; ++j, ++k) {
      if (k < last) {
        cu[k] = static_cast<int32_t>(pos);
        cu_seg[k] = static_cast<int32_t>(j);
      }
      pos += bounded_length(seg_length[j], row_len);
    }
    if (pad && k < last) {
      cu[k] = static_cast<int32_t>(pos);
      cu_seg[k] = -1;
    }
    carry += aggregate;
    __syncthreads();
  }
  fill_rest(cu, cu_seg, carry, last, num_rows * row_len);
}

void launch_layout(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len, bool flat,
                   const Tensor& cu, const Tensor& cu_seg, cudaStream_t stream) {
  layout_kernel<<<1, kLayoutThreads, 0, stream>>>(
      seg_length.const_data_ptr<int64_t>(), bin_offsets.const_data_ptr<int64_t>(), bin_offsets.numel() - 1,
      seg_length.numel(), num_rows, row_len, flat, cu.mutable_data_ptr<int32_t>(), cu_seg.mutable_data_ptr<int32_t>(),
      cu.numel());
  check_launch("layout");
}

// --- segment search shared by the gathers ------------------------------------------------------
// Last k in [lo, hi] with cu[k] <= p (cu[lo] <= p holds by construction).
__device__ __forceinline__ int64_t find_segment(const int32_t* __restrict__ cu, int64_t lo, int64_t hi, int64_t p) {
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= p) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The block's segment range for positions [p0, p1): computed once by thread 0. With no output
// segments (an inconsistent call) the range is empty: lo = 0 > hi = -1.
__device__ __forceinline__ void tile_range(const int32_t* __restrict__ cu, int64_t num_segments, int64_t p0,
                                           int64_t p1, int64_t& lo, int64_t& hi) {
  __shared__ int64_t range[2];
  if (threadIdx.x == 0 && num_segments <= 0) {
    range[0] = 0;
    range[1] = -1;
  } else if (threadIdx.x == 0) {
    range[0] = find_segment(cu, 0, num_segments - 1, p0);
    range[1] = find_segment(cu, range[0], num_segments - 1, p1 - 1);
  }
  __syncthreads();
  lo = range[0];
  hi = range[1];
}

// Where position p's element comes from, or -1 (padding, or a plan entry out of range). Unsigned
// sums: wrapped garbage from bad offsets lands outside [0, src_tokens) or, at worst, inside it, never
// in undefined behaviour. Also returns the output segment k (-1: none) and the offset in it.
struct Source {
  int64_t row;  // source row, -1 for padding
  int64_t k;    // output segment
  int64_t off;  // offset of p in its output segment
};

__device__ __forceinline__ Source locate(const int32_t* __restrict__ cu, const int32_t* __restrict__ cu_seg,
                                         const int64_t* __restrict__ seg_seq, const int64_t* __restrict__ seg_start,
                                         const int64_t* __restrict__ src_offsets, int64_t lo, int64_t hi, int64_t p,
                                         int64_t num_plan_segments, int64_t num_sources, int64_t src_tokens) {
  if (hi < lo) return {-1, -1, p};
  const int64_t k = find_segment(cu, lo, hi, p);
  const int64_t j = cu_seg[k], off = p - cu[k];
  if (j < 0 || j >= num_plan_segments) return {-1, k, off};
  const int64_t seq = seg_seq[j];
  if (seq < 0 || seq >= num_sources) return {-1, k, off};
  const uint64_t row = static_cast<uint64_t>(src_offsets[seq]) + static_cast<uint64_t>(seg_start[j]) +
                       static_cast<uint64_t>(off);
  return {row < static_cast<uint64_t>(src_tokens) ? static_cast<int64_t>(row) : -1, k, off};
}

template <int W> struct Word;
template <> struct Word<1> { using T = uint8_t; };
template <> struct Word<2> { using T = uint16_t; };
template <> struct Word<4> { using T = uint32_t; };
template <> struct Word<8> { using T = uint64_t; };
template <> struct alignas(16) Word<16> { using T = ulonglong2; };

// A fill value as the `ratio` words of one element: an element is copied in narrower words when an address is
// not aligned to its size (launch::aligned_word), and word i of a token record is then pattern.w[i % ratio].
template <typename T> struct Pattern {
  T w[16 / sizeof(T)];
  __device__ __forceinline__ T at(int64_t word, int ratio) const { return ratio == 1 ? w[0] : w[word % ratio]; }
};

template <typename T>
Pattern<T> pattern_of(const std::array<uint8_t, 16>& bytes, int ratio) {
  Pattern<T> p{};
  std::memcpy(&p.w, bytes.data(), sizeof(T) * ratio);
  return p;
}

// Blocks of a tiled gather, refused on the host past what a device accepts (2^31 - 1 blocks: 2^42 words).
inline unsigned gather_blocks(int64_t work, const char* op) {
  const int64_t blocks = launch::tiles(work, kTile);
  STD_TORCH_CHECK(blocks >= 0, "packkit::", op, ": ", work, " elements need more than 2^31 - 1 blocks of ", kTile,
                  "; split the batch");
  return static_cast<unsigned>(blocks);
}

// --- pack: any dtype (copied as words T, `ratio` words per element), F words per token ---------------
template <typename T>
__global__ void pack_kernel(const T* __restrict__ src, const int64_t* __restrict__ src_offsets,
                            const int64_t* __restrict__ seg_seq, const int64_t* __restrict__ seg_start,
                            const int32_t* __restrict__ cu, const int32_t* __restrict__ cu_seg, int64_t num_segments,
                            int64_t num_plan_segments, int64_t num_sources, int64_t src_tokens, int64_t features,
                            int64_t total_elems, Pattern<T> pad, Pattern<T> first, int ratio, bool has_first,
                            T* __restrict__ out) {
  const int64_t e0 = int64_t{blockIdx.x} * kTile, e1 = min(e0 + kTile, total_elems);
  int64_t lo, hi;
  tile_range(cu, num_segments, e0 / features, (e1 - 1) / features + 1, lo, hi);
  for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
    const int64_t p = e / features, f = e - p * features;
    const Source s = locate(cu, cu_seg, seg_seq, seg_start, src_offsets, lo, hi, p, num_plan_segments, num_sources,
                            src_tokens);
    T value = pad.at(f, ratio);
    if (s.row >= 0) value = (has_first && s.off == 0) ? first.at(f, ratio) : src[s.row * features + f];
    out[e] = value;
  }
}

// W: the word size (the element size, or narrower for a misaligned tensor: ratio words per element);
// features and total_elems count words.
template <int W>
void launch_pack(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                 const Tensor& cu, const Tensor& cu_seg, int64_t features, int64_t total_elems, int ratio,
                 const std::array<uint8_t, 16>& pad, const std::optional<std::array<uint8_t, 16>>& first,
                 const Tensor& out, cudaStream_t stream) {
  using T = typename Word<W>::T;
  const unsigned blocks = gather_blocks(total_elems, "pack");
  pack_kernel<T><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(src.const_data_ptr()), src_offsets.const_data_ptr<int64_t>(),
      seg_seq.const_data_ptr<int64_t>(), seg_start.const_data_ptr<int64_t>(), cu.const_data_ptr<int32_t>(),
      cu_seg.const_data_ptr<int32_t>(), cu_seg.numel(), seg_seq.numel(), src_offsets.numel() - 1, src.size(0), features,
      total_elems, pattern_of<T>(pad, ratio), pattern_of<T>(first.value_or(std::array<uint8_t, 16>{}), ratio), ratio,
      first.has_value(), static_cast<T*>(out.mutable_data_ptr()));
  check_launch("pack");
}

// --- pack_batch: the fused gather --------------------------------------------------------------
template <typename Id, typename Label>
__global__ void pack_batch_kernel(const Id* __restrict__ ids_src, const Label* __restrict__ labels_src,
                                  const int64_t* __restrict__ src_offsets, const int64_t* __restrict__ seg_seq,
                                  const int64_t* __restrict__ seg_start, const int32_t* __restrict__ cu,
                                  const int32_t* __restrict__ cu_seg, int64_t num_segments, int64_t num_plan_segments,
                                  int64_t num_sources, int64_t src_tokens, int64_t total, Id pad_id,
                                  Label ignore_index, bool mask_first_label, int64_t position_start,
                                  Id* __restrict__ ids, Label* __restrict__ labels, int64_t* __restrict__ positions,
                                  int32_t* __restrict__ seq_idx) {
  const int64_t p0 = int64_t{blockIdx.x} * kTile, p1 = min(p0 + kTile, total);
  int64_t lo, hi;
  tile_range(cu, num_segments, p0, p1, lo, hi);
  for (int64_t p = p0 + threadIdx.x; p < p1; p += kThreads) {
    const Source s = locate(cu, cu_seg, seg_seq, seg_start, src_offsets, lo, hi, p, num_plan_segments, num_sources,
                            src_tokens);
    Id id = pad_id;
    Label label = ignore_index;
    if (s.row >= 0) {
      id = ids_src[s.row];
      label = (mask_first_label && s.off == 0) ? ignore_index : labels_src[s.row];
    }
    ids[p] = id;
    labels[p] = label;
    positions[p] = position_start + s.off;
    seq_idx[p] = static_cast<int32_t>(max(s.k, int64_t{0}));
  }
}

template <typename Id, typename Label>
void launch_pack_batch(const Tensor& ids_src, const Tensor& labels_src, const Tensor& src_offsets,
                       const Tensor& seg_seq, const Tensor& seg_start, const Tensor& cu, const Tensor& cu_seg,
                       int64_t total, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
                       int64_t position_start, const Tensor& ids, const Tensor& labels, const Tensor& positions,
                       const Tensor& seq_idx, cudaStream_t stream) {
  const unsigned blocks = gather_blocks(total, "pack_batch");
  pack_batch_kernel<Id, Label><<<blocks, kThreads, 0, stream>>>(
      ids_src.const_data_ptr<Id>(), labels_src.const_data_ptr<Label>(), src_offsets.const_data_ptr<int64_t>(),
      seg_seq.const_data_ptr<int64_t>(), seg_start.const_data_ptr<int64_t>(), cu.const_data_ptr<int32_t>(),
      cu_seg.const_data_ptr<int32_t>(), cu_seg.numel(), seg_seq.numel(), src_offsets.numel() - 1, ids_src.size(0),
      total, static_cast<Id>(pad_id),
      static_cast<Label>(ignore_index), mask_first_label, position_start, ids.mutable_data_ptr<Id>(),
      labels.mutable_data_ptr<Label>(), positions.mutable_data_ptr<int64_t>(), seq_idx.mutable_data_ptr<int32_t>());
  check_launch("pack_batch");
}

// --- unpack: fill with pad, then scatter every kept element back ---------------------------------
template <typename T>
__global__ void fill_kernel(T* __restrict__ out, int64_t count, Pattern<T> value, int ratio) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value.at(i, ratio);
  }
}

// padded_max_len < 0: flat output at src_offsets[seq] + start; else [num_sequences, max_len] rows.
template <typename T>
__global__ void unpack_kernel(const T* __restrict__ packed, const int64_t* __restrict__ src_offsets,
                              const int64_t* __restrict__ seg_seq, const int64_t* __restrict__ seg_start,
                              const int32_t* __restrict__ cu, const int32_t* __restrict__ cu_seg,
                              int64_t num_segments, int64_t num_plan_segments, int64_t num_sources, int64_t features,
                              int64_t total_elems, int64_t padded_max_len, int64_t out_tokens, T* __restrict__ out) {
  const int64_t e0 = int64_t{blockIdx.x} * kTile, e1 = min(e0 + kTile, total_elems);
  int64_t lo, hi;
  tile_range(cu, num_segments, e0 / features, (e1 - 1) / features + 1, lo, hi);
  if (hi < lo) return;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
    const int64_t p = e / features, f = e - p * features;
    const int64_t k = find_segment(cu, lo, hi, p);
    const int64_t j = cu_seg[k];
    if (j < 0 || j >= num_plan_segments) continue;
    const int64_t seq = seg_seq[j];
    if (seq < 0 || seq >= num_sources) continue;  // num_sources: src_offsets entries - 1, or output rows
    // Unsigned: a negative or wrapped position is simply out of range.
    const uint64_t off = static_cast<uint64_t>(seg_start[j]) + static_cast<uint64_t>(p - cu[k]);
    uint64_t dst;
    if (padded_max_len < 0) {
      dst = static_cast<uint64_t>(src_offsets[seq]) + off;
    } else {
      if (off >= static_cast<uint64_t>(padded_max_len)) continue;
      dst = static_cast<uint64_t>(seq) * padded_max_len + off;
    }
    if (dst < static_cast<uint64_t>(out_tokens)) out[static_cast<int64_t>(dst) * features + f] = packed[e];
  }
}

template <int W>
void launch_unpack(const Tensor& packed, const int64_t* src_offsets, int64_t num_sources, const Tensor& seg_seq,
                   const Tensor& seg_start,
                   const Tensor& cu, const Tensor& cu_seg, int64_t features, int64_t total_elems, int ratio,
                   int64_t padded_max_len, int64_t out_tokens, const std::array<uint8_t, 16>& pad, const Tensor& out,
                   cudaStream_t stream) {
  using T = typename Word<W>::T;
  const int64_t out_elems = out_tokens * features;
  if (out_elems > 0) {
    const int64_t blocks = launch::strided(out_elems, kThreads, 65536);
    fill_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<T*>(out.mutable_data_ptr()),
                                                                         out_elems, pattern_of<T>(pad, ratio), ratio);
    check_launch("unpack");
  }
  if (total_elems > 0 && out_elems > 0) {
    unpack_kernel<T><<<gather_blocks(total_elems, "unpack"), kThreads, 0, stream>>>(
        static_cast<const T*>(packed.const_data_ptr()), src_offsets, seg_seq.const_data_ptr<int64_t>(),
        seg_start.const_data_ptr<int64_t>(), cu.const_data_ptr<int32_t>(), cu_seg.const_data_ptr<int32_t>(),
        cu_seg.numel(), seg_seq.numel(), num_sources, features, total_elems, padded_max_len, out_tokens,
        static_cast<T*>(out.mutable_data_ptr()));
    check_launch("unpack");
  }
}

template <typename F>
void dispatch_width(size_t width, const char* op, F&& f) {
  switch (width) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    default: STD_TORCH_CHECK(false, "packkit::", op, ": unsupported element size ", width);
  }
}

}  // namespace

// --- out-variants (the one implementation of each op) --------------------------------------------
void layout_out_cuda(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len,
                     bool flat, const Tensor& cu_seqlens, const Tensor& cu_seg) {
  check_layout_outputs("layout_out", seg_length, bin_offsets, num_rows, row_len, flat, cu_seqlens, cu_seg);
  check_cuda(seg_length, "layout", "seg_length");
  torch::stable::accelerator::DeviceGuard guard(seg_length.get_device_index());
  const Tensor lengths = torch::stable::contiguous(seg_length), offsets = torch::stable::contiguous(bin_offsets);
  check_aligned("layout", {{"seg_length", &lengths}, {"bin_offsets", &offsets}, {"cu_seqlens", &cu_seqlens},
                           {"cu_seg", &cu_seg}});
  launch_layout(lengths, offsets, num_rows, row_len, flat, cu_seqlens, cu_seg, current_stream(lengths));
}

namespace {
void pack_cuda_impl(const char* op, const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq,
                    const Tensor& seg_start, const Tensor& cu_seqlens, const Tensor& cu_seg, int64_t num_rows,
                    int64_t row_len, bool flat, double pad_value, std::optional<double> first_value,
                    const Tensor& out) {
  check_index_tensor(src_offsets, op, "src_offsets", ScalarType::Long);
  check_segment_args(src, seg_seq, seg_start, cu_seqlens, cu_seg, op);
  check_same_device(src, src_offsets, op, "src", "src_offsets");
  check_cuda(src, op, "src");
  STD_TORCH_CHECK(src_offsets.numel() >= 1, "packkit::", op, ": src_offsets needs num_sequences + 1 >= 1 entries");
  const int64_t total = checked_total_tokens(num_rows, row_len, flat, op);
  torch::stable::accelerator::DeviceGuard guard(src.get_device_index());
  const Tensor s = torch::stable::contiguous(src);
  const Tensor offs = torch::stable::contiguous(src_offsets), sq = torch::stable::contiguous(seg_seq);
  const Tensor st = torch::stable::contiguous(seg_start), cu = torch::stable::contiguous(cu_seqlens);
  const Tensor cs = torch::stable::contiguous(cu_seg);
  check_aligned(op, {{"src_offsets", &offs}, {"seg_seq", &sq}, {"seg_start", &st}, {"cu_seqlens", &cu},
                     {"cu_seg", &cs}});
  const int64_t features = feature_numel(s, 1), total_elems = total * features;
  const auto pad = value_bytes(pad_value, s.scalar_type());
  std::optional<std::array<uint8_t, 16>> first;
  if (first_value) first = value_bytes(*first_value, s.scalar_type());
  if (total_elems == 0) return;
  cudaStream_t stream = current_stream(s);
  const int64_t elem = s.element_size();
  const int64_t word = launch::aligned_word(elem, {s.const_data_ptr(), out.const_data_ptr()});
  const int ratio = static_cast<int>(elem / word);
  dispatch_width(word, op, [&](auto w) {
    launch_pack<decltype(w)::value>(s, offs, sq, st, cu, cs, features * ratio, total_elems * ratio, ratio, pad, first,
                                    out, stream);
  });
}

// Flat unpack (src_offsets given): out [num_src_tokens, *f]; padded (none): out [num_sequences, max_len, *f].
void unpack_cuda_impl(const char* op, const Tensor& packed, const std::optional<Tensor>& src_offsets,
                      const Tensor& seg_seq, const Tensor& seg_start, const Tensor& cu_seqlens, const Tensor& cu_seg,
                      bool flat, double pad_value, const Tensor& out) {
  check_segment_args(packed, seg_seq, seg_start, cu_seqlens, cu_seg, op);
  check_cuda(packed, op, "packed");
  const int64_t tokens = packed_tokens(packed, flat, op);
  torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  const Tensor p = torch::stable::contiguous(packed), sq = torch::stable::contiguous(seg_seq);
  const Tensor st = torch::stable::contiguous(seg_start), cu = torch::stable::contiguous(cu_seqlens);
  const Tensor cs = torch::stable::contiguous(cu_seg);
  std::optional<Tensor> offs;
  if (src_offsets) {
    check_index_tensor(*src_offsets, op, "src_offsets", ScalarType::Long);
    check_same_device(packed, *src_offsets, op, "packed", "src_offsets");
    STD_TORCH_CHECK(src_offsets->numel() >= 1, "packkit::", op, ": src_offsets needs num_sequences + 1 >= 1 entries");
    offs = torch::stable::contiguous(*src_offsets);
    check_aligned(op, {{"src_offsets", &*offs}});
  }
  check_aligned(op, {{"seg_seq", &sq}, {"seg_start", &st}, {"cu_seqlens", &cu}, {"cu_seg", &cs}});
  const int64_t token_dims = flat ? 1 : 2, features = feature_numel(p, token_dims);
  const int64_t out_rows = out.size(0), max_len = offs ? -1 : out.size(1);
  const int64_t out_tokens = max_len >= 0 ? out_rows * max_len : out_rows;
  const auto pad = value_bytes(pad_value, p.scalar_type());
  cudaStream_t stream = current_stream(p);
  const int64_t elem = p.element_size();
  const int64_t word = launch::aligned_word(elem, {p.const_data_ptr(), out.const_data_ptr()});
  const int ratio = static_cast<int>(elem / word);
  dispatch_width(word, op, [&](auto w) {
    // Padded: sequences are output rows; flat: the entries of src_offsets.
    const int64_t num_sources = offs ? offs->numel() - 1 : out_rows;
    launch_unpack<decltype(w)::value>(p, offs ? offs->const_data_ptr<int64_t>() : nullptr, num_sources, sq, st, cu, cs,
                                      features * ratio, tokens * features * ratio, ratio, max_len, out_tokens, pad, out,
                                      stream);
  });
}

}  // namespace

void pack_out_cuda(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                   const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out, double pad_value,
                   std::optional<double> first_value) {
  const auto rows = check_pack_output("pack_out", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out);
  pack_cuda_impl("pack_out", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, rows.first, rows.second, flat,
                 pad_value, first_value, out);
}

void pack_batch_out_cuda(const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& src_offsets,
                         const Tensor& seg_seq, const Tensor& seg_start, const Tensor& seg_length,
                         const Tensor& bin_offsets, bool flat, const Tensor& out_input_ids, const Tensor& out_labels,
                         const Tensor& out_position_ids, const Tensor& out_seq_idx, const Tensor& out_cu_seqlens,
                         const Tensor& out_cu_seg, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
                         int64_t position_start) {
  const Tensor& label_src = check_pack_batch_tokens(input_ids, labels);
  const auto rows =
      check_pack_batch_outputs(input_ids, label_src, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, flat,
                               out_input_ids, out_labels, out_position_ids, out_seq_idx, out_cu_seqlens, out_cu_seg);
  const int64_t num_rows = rows.first, row_len = rows.second;
  check_index_tensor(src_offsets, "pack_batch", "src_offsets", ScalarType::Long);
  check_index_tensor(seg_seq, "pack_batch", "seg_seq", ScalarType::Long);
  check_index_tensor(seg_start, "pack_batch", "seg_start", ScalarType::Long);
  for (const Tensor* t : {&label_src, &src_offsets, &seg_seq, &seg_start, &seg_length, &bin_offsets}) {
    check_same_device(input_ids, *t, "pack_batch", "input_ids", "every other tensor");
  }
  check_cuda(input_ids, "pack_batch", "input_ids");
  STD_TORCH_CHECK(src_offsets.numel() >= 1, "packkit::pack_batch: src_offsets needs num_sequences + 1 >= 1 entries");
  STD_TORCH_CHECK(seg_seq.numel() == seg_start.numel(), "packkit::pack_batch: seg_seq and seg_start must have the same length");
  value_bytes(static_cast<double>(pad_id), input_ids.scalar_type());  // range checks with a clear message
  value_bytes(static_cast<double>(ignore_index), label_src.scalar_type());
  torch::stable::accelerator::DeviceGuard guard(input_ids.get_device_index());
  const Tensor& cu = out_cu_seqlens;
  const Tensor& cu_seg = out_cu_seg;
  const Tensor lengths = torch::stable::contiguous(seg_length), offsets = torch::stable::contiguous(bin_offsets);
  const Tensor ids_src = torch::stable::contiguous(input_ids), lab_src = torch::stable::contiguous(label_src);
  const Tensor offs = torch::stable::contiguous(src_offsets), sq = torch::stable::contiguous(seg_seq);
  const Tensor st = torch::stable::contiguous(seg_start);
  check_aligned("pack_batch", {{"input_ids", &ids_src}, {"labels", &lab_src}, {"src_offsets", &offs},
                               {"seg_seq", &sq}, {"seg_start", &st}, {"seg_length", &lengths},
                               {"bin_offsets", &offsets}, {"out_input_ids", &out_input_ids},
                               {"out_labels", &out_labels}, {"out_position_ids", &out_position_ids},
                               {"out_seq_idx", &out_seq_idx}, {"out_cu_seqlens", &cu}, {"out_cu_seg", &cu_seg}});
  launch_layout(lengths, offsets, num_rows, row_len, flat, cu, cu_seg, current_stream(lengths));
  const int64_t total = flat ? row_len : num_rows * row_len;
  if (total == 0) return;
  cudaStream_t stream = current_stream(ids_src);
  const bool ids64 = ids_src.scalar_type() == ScalarType::Long, lab64 = lab_src.scalar_type() == ScalarType::Long;
  auto go = [&](auto id_tag, auto label_tag) {
    launch_pack_batch<decltype(id_tag), decltype(label_tag)>(ids_src, lab_src, offs, sq, st, cu, cu_seg, total, pad_id,
                                                             ignore_index, mask_first_label, position_start,
                                                             out_input_ids, out_labels, out_position_ids, out_seq_idx,
                                                             stream);
  };
  if (ids64 && lab64) go(int64_t{}, int64_t{});
  else if (ids64) go(int64_t{}, int32_t{});
  else if (lab64) go(int32_t{}, int64_t{});
  else go(int32_t{}, int32_t{});
}

void unpack_out_cuda(const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                     const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out, double pad_value) {
  check_unpack_output("unpack_out", packed, &src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out);
  unpack_cuda_impl("unpack_out", packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out);
}

void unpack_padded_out_cuda(const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                            const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out,
                            double pad_value) {
  check_unpack_output("unpack_padded_out", packed, nullptr, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out);
  unpack_cuda_impl("unpack_padded_out", packed, std::nullopt, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value,
                   out);
}

// --- functional ops: allocate, then the out-variant's implementation --------------------------------
std::tuple<Tensor, Tensor> layout_cuda(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows,
                                       int64_t row_len, bool flat, int64_t num_cu_seqlens) {
  check_layout_args(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens);
  check_cuda(seg_length, "layout", "seg_length");
  torch::stable::accelerator::DeviceGuard guard(seg_length.get_device_index());
  Tensor cu = torch::stable::new_empty(seg_length, {num_cu_seqlens}, ScalarType::Int);
  Tensor cu_seg = torch::stable::new_empty(seg_length, {num_cu_seqlens - 1}, ScalarType::Int);
  layout_out_cuda(seg_length, bin_offsets, num_rows, row_len, flat, cu, cu_seg);
  return {cu, cu_seg};
}

Tensor pack_cuda(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                 const Tensor& cu_seqlens, const Tensor& cu_seg, int64_t num_rows, int64_t row_len, bool flat,
                 double pad_value, std::optional<double> first_value) {
  STD_TORCH_CHECK(src.dim() >= 1, "packkit::pack: src must be [tokens, *feature], got a 0-d tensor");
  checked_total_tokens(num_rows, row_len, flat, "pack");
  check_cuda(src, "pack", "src");
  torch::stable::accelerator::DeviceGuard guard(src.get_device_index());
  Tensor out = torch::stable::new_empty(src, packed_shape(src, num_rows, row_len, flat));
  pack_cuda_impl("pack", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value,
                 first_value, out);
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> pack_batch_cuda(
    const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& src_offsets, const Tensor& seg_seq,
    const Tensor& seg_start, const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len,
    bool flat, int64_t num_cu_seqlens, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
    int64_t position_start) {
  const Tensor& label_src = check_pack_batch_tokens(input_ids, labels);
  check_layout_args(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens);
  check_cuda(input_ids, "pack_batch", "input_ids");
  torch::stable::accelerator::DeviceGuard guard(input_ids.get_device_index());
  const std::vector<int64_t> shape = packed_shape(input_ids, num_rows, row_len, flat);
  Tensor ids = torch::stable::new_empty(input_ids, shape);
  Tensor lab = torch::stable::new_empty(label_src, shape);
  Tensor positions = torch::stable::new_empty(input_ids, shape, ScalarType::Long);
  Tensor seq_idx = torch::stable::new_empty(input_ids, shape, ScalarType::Int);
  Tensor cu = torch::stable::new_empty(input_ids, {num_cu_seqlens}, ScalarType::Int);
  Tensor cu_seg = torch::stable::new_empty(input_ids, {num_cu_seqlens - 1}, ScalarType::Int);
  pack_batch_out_cuda(input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, flat, ids, lab,
                      positions, seq_idx, cu, cu_seg, pad_id, ignore_index, mask_first_label, position_start);
  return {ids, lab, positions, seq_idx, cu};
}

Tensor unpack_cuda(const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                   const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, int64_t num_src_tokens,
                   double pad_value) {
  STD_TORCH_CHECK(num_src_tokens >= 0, "packkit::unpack: num_src_tokens must be >= 0");
  packed_tokens(packed, flat, "unpack");
  check_cuda(packed, "unpack", "packed");
  torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  Tensor out = torch::stable::new_empty(packed, unpacked_shape(packed, {num_src_tokens}, flat));
  unpack_cuda_impl("unpack", packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out);
  return out;
}

Tensor unpack_padded_cuda(const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                          const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, int64_t num_sequences,
                          int64_t max_len, double pad_value) {
  STD_TORCH_CHECK(num_sequences >= 0 && max_len >= 0,
                  "packkit::unpack_padded: num_sequences and max_len must be >= 0");
  packed_tokens(packed, flat, "unpack_padded");
  check_cuda(packed, "unpack_padded", "packed");
  torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  Tensor out = torch::stable::new_empty(packed, unpacked_shape(packed, {num_sequences, max_len}, flat));
  unpack_cuda_impl("unpack_padded", packed, std::nullopt, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value,
                   out);
  return out;
}

}  // namespace packkit::ops

STABLE_TORCH_LIBRARY_IMPL(packkit, CUDA, m) {
  m.impl("layout", TORCH_BOX(&packkit::ops::layout_cuda));
  m.impl("pack", TORCH_BOX(&packkit::ops::pack_cuda));
  m.impl("pack_batch", TORCH_BOX(&packkit::ops::pack_batch_cuda));
  m.impl("unpack", TORCH_BOX(&packkit::ops::unpack_cuda));
  m.impl("unpack_padded", TORCH_BOX(&packkit::ops::unpack_padded_cuda));
  m.impl("layout_out", TORCH_BOX(&packkit::ops::layout_out_cuda));
  m.impl("pack_out", TORCH_BOX(&packkit::ops::pack_out_cuda));
  m.impl("pack_batch_out", TORCH_BOX(&packkit::ops::pack_batch_out_cuda));
  m.impl("unpack_out", TORCH_BOX(&packkit::ops::unpack_out_cuda));
  m.impl("unpack_padded_out", TORCH_BOX(&packkit::ops::unpack_padded_out_cuda));
}
