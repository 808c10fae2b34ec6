// Argument checks shared by every backend of the pack ops. They read only metadata (shapes, dtypes,
// devices), never tensor data, so the CUDA path stays free of host syncs; the CPU path adds data
// checks on top (pack_op.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

namespace packkit::ops {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

inline void check_index_tensor(const Tensor& t, const char* op, const char* name, ScalarType dtype) {
  STD_TORCH_CHECK(t.dim() == 1, "packkit::", op, ": ", name, " must be 1-D, got ", t.dim(), " dims");
  STD_TORCH_CHECK(t.scalar_type() == dtype, "packkit::", op, ": ", name, " must be ",
                  dtype == ScalarType::Long ? "int64" : "int32");
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* name_a,
                              const char* name_b) {
  STD_TORCH_CHECK(a.device() == b.device(), "packkit::", op, ": ", name_a, " and ", name_b,
                  " must be on the same device");
}

// Output positions are addressed with int32 cu_seqlens (the flash-attn format), so a packed batch
// holds fewer than 2^31 tokens.
inline int64_t checked_total_tokens(int64_t num_rows, int64_t row_len, bool flat, const char* op) {
  STD_TORCH_CHECK(num_rows >= 0 && row_len >= 0, "packkit::", op, ": num_rows and row_len must be >= 0, got ",
                  num_rows, " and ", row_len);
  STD_TORCH_CHECK(!flat || num_rows == 1, "packkit::", op,
                  ": the flat layout is one row of row_len tokens, so num_rows must be 1, got ", num_rows);
  STD_TORCH_CHECK(row_len == 0 || num_rows <= std::numeric_limits<int32_t>::max() / row_len, "packkit::", op,
                  ": num_rows * row_len must be < 2^31 (cu_seqlens are int32), got ", num_rows, " * ", row_len);
  return num_rows * row_len;
}

inline void check_layout_args(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows,
                              int64_t row_len, bool flat, int64_t num_cu_seqlens) {
  check_index_tensor(seg_length, "layout", "seg_length", ScalarType::Long);
  check_index_tensor(bin_offsets, "layout", "bin_offsets", ScalarType::Long);
  check_same_device(seg_length, bin_offsets, "layout", "seg_length", "bin_offsets");
  checked_total_tokens(num_rows, row_len, flat, "layout");
  STD_TORCH_CHECK(bin_offsets.numel() >= 1, "packkit::layout: bin_offsets needs num_bins + 1 >= 1 entries");
  STD_TORCH_CHECK(flat || bin_offsets.numel() - 1 <= num_rows, "packkit::layout: the plan has ",
                  bin_offsets.numel() - 1, " bins but num_rows is ", num_rows);
  STD_TORCH_CHECK(seg_length.numel() < std::numeric_limits<int32_t>::max(),
                  "packkit::layout: at most 2^31 - 2 segments");
  STD_TORCH_CHECK(num_cu_seqlens >= 1 && num_cu_seqlens - 1 <= seg_length.numel() + (flat ? 1 : num_rows),
                  "packkit::layout: num_cu_seqlens must be in [1, num_segments + padding segments + 1], got ",
                  num_cu_seqlens);
}

// Checks the source, plan and layout tensors of pack/unpack; returns the number of feature elements
// per token (the product of the trailing dims).
inline void check_segment_args(const Tensor& ref, const Tensor& seg_seq, const Tensor& seg_start,
                               const Tensor& cu_seqlens, const Tensor& cu_seg, const char* op) {
  check_index_tensor(seg_seq, op, "seg_seq", ScalarType::Long);
  check_index_tensor(seg_start, op, "seg_start", ScalarType::Long);
  check_index_tensor(cu_seqlens, op, "cu_seqlens", ScalarType::Int);
  check_index_tensor(cu_seg, op, "cu_seg", ScalarType::Int);
  STD_TORCH_CHECK(seg_seq.numel() == seg_start.numel(), "packkit::", op,
                  ": seg_seq and seg_start must have the same length");
  STD_TORCH_CHECK(cu_seqlens.numel() == cu_seg.numel() + 1, "packkit::", op,
                  ": cu_seqlens must have one more entry than cu_seg");
  check_same_device(ref, seg_seq, op, "the data", "seg_seq");
  check_same_device(ref, seg_start, op, "the data", "seg_start");
  check_same_device(ref, cu_seqlens, op, "the data", "cu_seqlens");
  check_same_device(ref, cu_seg, op, "the data", "cu_seg");
}

inline int64_t feature_numel(const Tensor& t, int64_t token_dims) {
  int64_t n = 1;
  for (int64_t d = token_dims; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// Packed tensors carry the token dims first: [num_rows, row_len, *feature] or [row_len, *feature].
// Returns the number of token positions.
inline int64_t packed_tokens(const Tensor& packed, bool flat, const char* op) {
  const int64_t token_dims = flat ? 1 : 2;
  STD_TORCH_CHECK(packed.dim() >= token_dims, "packkit::", op, ": packed must have at least ", token_dims,
                  " dims for the ", flat ? "flat" : "padded", " layout, got ", packed.dim());
  int64_t tokens = 1;
  for (int64_t d = 0; d < token_dims; ++d) tokens *= packed.size(d);
  STD_TORCH_CHECK(tokens <= std::numeric_limits<int32_t>::max(), "packkit::", op,
                  ": packed must hold fewer than 2^31 tokens (cu_seqlens are int32)");
  return tokens;
}

// pack_batch's token inputs: 1-D int64/int32 ids and labels (the ids when labels is None), one
// device. Returns the label source.
inline const Tensor& check_pack_batch_tokens(const Tensor& input_ids, const std::optional<Tensor>& labels) {
  STD_TORCH_CHECK(input_ids.dim() == 1, "packkit::pack_batch: input_ids must be 1-D (all sequences concatenated)");
  const Tensor& label_src = labels.has_value() ? *labels : input_ids;
  STD_TORCH_CHECK(label_src.dim() == 1 && label_src.size(0) == input_ids.size(0),
                  "packkit::pack_batch: labels must be 1-D and as long as input_ids");
  check_same_device(input_ids, label_src, "pack_batch", "input_ids", "labels");
  for (const Tensor* t : {&input_ids, &label_src}) {
    STD_TORCH_CHECK(t->scalar_type() == ScalarType::Long || t->scalar_type() == ScalarType::Int,
                    "packkit::pack_batch: input_ids and labels must be int64 or int32");
  }
  return label_src;
}

// The bytes of `value` converted to `dtype` (any dtype, incl. half/bool/complex), built with torch's
// own conversion so every backend pads with exactly the same bit pattern.
inline std::array<uint8_t, 16> value_bytes(double value, ScalarType dtype) {
  double lo = -1.0 / 0.0, hi = 1.0 / 0.0;
  switch (dtype) {
    case ScalarType::Bool: lo = 0, hi = 1; break;
    case ScalarType::Byte: lo = 0, hi = 255; break;
    case ScalarType::Char: lo = -128, hi = 127; break;
    case ScalarType::Short: lo = -32768, hi = 32767; break;
    case ScalarType::Int: lo = -2147483648.0, hi = 2147483647.0; break;
    case ScalarType::Long: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;
    default: break;
  }
  const bool integral = lo > -1.0 / 0.0;
  STD_TORCH_CHECK(!integral || (value >= lo && value <= hi && value == static_cast<double>(static_cast<int64_t>(value))),
                  "packkit: fill value ", value, " cannot be represented in the tensor's dtype (allowed: integers in [",
                  static_cast<int64_t>(lo), ", ", static_cast<int64_t>(hi), "])");
  std::array<uint8_t, 16> bytes{};
  Tensor one = torch::stable::full({1}, value, dtype);
  std::memcpy(bytes.data(), one.const_data_ptr(), one.element_size());
  return bytes;
}

}  // namespace packkit::ops
