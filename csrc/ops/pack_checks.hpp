// Argument checks shared by every backend of the pack ops. They read only metadata (shapes, dtypes,
// devices), never tensor data, so the CUDA path stays free of host syncs; the CPU path adds data
// checks on top (pack_op.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  // num_rows is bounded even when row_len == 0: the layout walks every row (a fuzz finding: 2^62 rows hung).
  STD_TORCH_CHECK(num_rows <= std::numeric_limits<int32_t>::max() &&
                      (row_len == 0 || num_rows <= std::numeric_limits<int32_t>::max() / row_len), "packkit::", op,
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

// --- Outputs of the out-variants (metadata only) ----------------------------------------------------
// An output the caller passes in must have exactly the shape, dtype and device the functional op would
// allocate, and be contiguous (the kernels write it as one dense block).
inline void check_output(const Tensor& out, const char* op, const char* name, const Tensor& like_device,
                         ScalarType dtype, const std::vector<int64_t>& shape) {
  STD_TORCH_CHECK(out.device() == like_device.device(), "packkit::", op, ": ", name,
                  " must be on the same device as the inputs");
  STD_TORCH_CHECK(out.scalar_type() == dtype, "packkit::", op, ": ", name, " has dtype ", out.scalar_type(),
                  " but must be ", dtype);
  bool same = out.dim() == static_cast<int64_t>(shape.size());
  for (int64_t d = 0; same && d < out.dim(); ++d) same = out.size(d) == shape[d];
  if (!same) {
    std::string want = "[", got = "[";
    for (size_t d = 0; d < shape.size(); ++d) want += (d ? ", " : "") + std::to_string(shape[d]);
    for (int64_t d = 0; d < out.dim(); ++d) got += (d ? ", " : "") + std::to_string(out.size(d));
    STD_TORCH_CHECK(false, "packkit::", op, ": ", name, " must have shape ", want, "], got ", got, "]");
  }
  STD_TORCH_CHECK(out.is_contiguous(), "packkit::", op, ": ", name, " must be contiguous");
}

// Outputs are written while inputs are still being read: overlapping memory would corrupt both.
// Compares address ranges only (no data read), so it is free on every device.
inline void check_no_overlap(const Tensor& out, const Tensor& in, const char* op, const char* out_name,
                             const char* in_name) {
  if (out.numel() == 0 || in.numel() == 0 || out.device() != in.device()) return;
  const auto* a = static_cast<const uint8_t*>(out.const_data_ptr());
  const auto* b = static_cast<const uint8_t*>(in.const_data_ptr());
  // `in` may be strided: bound it by its largest reachable element (strides here are >= 0).
  int64_t in_span = 1;
  for (int64_t d = 0; d < in.dim(); ++d) in_span += (in.size(d) - 1) * in.stride(d);
  const uint8_t* a_end = a + out.numel() * out.element_size();
  const uint8_t* b_end = b + in_span * in.element_size();
  STD_TORCH_CHECK(a_end <= b || b_end <= a, "packkit::", op, ": ", out_name, " overlaps ", in_name,
                  "; outputs must not share memory with inputs");
}

// [num_rows, row_len, *feature] (padded) or [row_len, *feature] (flat) from an output of that form.
// Returns {num_rows, row_len}; checks the leading dims exist.
inline std::pair<int64_t, int64_t> packed_rows_of(const Tensor& out, bool flat, int64_t feature_dims, const char* op,
                                                  const char* name) {
  const int64_t token_dims = flat ? 1 : 2;
  STD_TORCH_CHECK(out.dim() == token_dims + feature_dims, "packkit::", op, ": ", name, " must have ",
                  token_dims + feature_dims, " dims (", flat ? "[row_len" : "[num_rows, row_len",
                  feature_dims ? ", *feature]" : "]", "), got ", out.dim());
  return flat ? std::pair<int64_t, int64_t>{1, out.size(0)} : std::pair<int64_t, int64_t>{out.size(0), out.size(1)};
}

using NamedTensors = std::initializer_list<std::pair<const char*, const Tensor*>>;

// No output overlaps an input or another output.
inline void check_disjoint(const char* op, NamedTensors outs, NamedTensors ins) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const auto& i : ins) check_no_overlap(*o->second, *i.second, op, o->first, i.first);
    for (auto o2 = std::next(o); o2 != outs.end(); ++o2) check_no_overlap(*o->second, *o2->second, op, o->first, o2->first);
  }
}

// layout_out: cu_seqlens int32 [num_cu_seqlens] (its length gives num_cu_seqlens), cu_seg int32
// [num_cu_seqlens - 1], on the plan's device.
inline void check_layout_outputs(const char* op, const Tensor& seg_length, const Tensor& bin_offsets,
                                 int64_t num_rows, int64_t row_len, bool flat, const Tensor& cu_seqlens,
                                 const Tensor& cu_seg) {
  STD_TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1, "packkit::", op,
                  ": cu_seqlens must be 1-D int32 [num_cu_seqlens >= 1]");
  const int64_t num_cu = cu_seqlens.numel();
  check_layout_args(seg_length, bin_offsets, num_rows, row_len, flat, num_cu);
  check_output(cu_seqlens, op, "cu_seqlens", seg_length, ScalarType::Int, {num_cu});
  check_output(cu_seg, op, "cu_seg", seg_length, ScalarType::Int, {num_cu - 1});
  check_disjoint(op, {{"cu_seqlens", &cu_seqlens}, {"cu_seg", &cu_seg}},
                 {{"seg_length", &seg_length}, {"bin_offsets", &bin_offsets}});
}

// pack_out: out is [num_rows, row_len, *feature] (padded) or [row_len, *feature] (flat), src's dtype.
// Returns {num_rows, row_len}.
inline std::pair<int64_t, int64_t> check_pack_output(const char* op, const Tensor& src, const Tensor& src_offsets,
                                                     const Tensor& seg_seq, const Tensor& seg_start,
                                                     const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat,
                                                     const Tensor& out) {
  STD_TORCH_CHECK(src.dim() >= 1, "packkit::", op, ": src must be [tokens, *feature], got a 0-d tensor");
  const auto rows = packed_rows_of(out, flat, src.dim() - 1, op, "out");
  std::vector<int64_t> shape;
  if (!flat) shape.push_back(rows.first);
  shape.push_back(rows.second);
  for (int64_t d = 1; d < src.dim(); ++d) shape.push_back(src.size(d));
  check_output(out, op, "out", src, src.scalar_type(), shape);
  check_disjoint(op, {{"out", &out}}, {{"src", &src}, {"src_offsets", &src_offsets}, {"seg_seq", &seg_seq},
                                       {"seg_start", &seg_start}, {"cu_seqlens", &cu_seqlens}, {"cu_seg", &cu_seg}});
  return rows;
}

// pack_batch_out: input_ids/labels/position_ids (int64)/seq_idx (int32) outputs all [num_rows, row_len]
// (or [row_len] flat) with the dtypes of input_ids and labels; cu_seqlens int32 [num_cu_seqlens] and
// cu_seg int32 [num_cu_seqlens - 1]. Returns {num_rows, row_len}.
inline std::pair<int64_t, int64_t> check_pack_batch_outputs(
    const Tensor& input_ids, const Tensor& label_src, const Tensor& src_offsets, const Tensor& seg_seq,
    const Tensor& seg_start, const Tensor& seg_length, const Tensor& bin_offsets, bool flat, const Tensor& out_ids,
    const Tensor& out_labels, const Tensor& out_positions, const Tensor& out_seq_idx, const Tensor& out_cu,
    const Tensor& out_cu_seg) {
  const char* op = "pack_batch_out";
  const auto rows = packed_rows_of(out_ids, flat, 0, op, "out_input_ids");
  const std::vector<int64_t> shape = flat ? std::vector<int64_t>{rows.second} : std::vector<int64_t>{rows.first, rows.second};
  check_output(out_ids, op, "out_input_ids", input_ids, input_ids.scalar_type(), shape);
  check_output(out_labels, op, "out_labels", input_ids, label_src.scalar_type(), shape);
  check_output(out_positions, op, "out_position_ids", input_ids, ScalarType::Long, shape);
  check_output(out_seq_idx, op, "out_seq_idx", input_ids, ScalarType::Int, shape);
  STD_TORCH_CHECK(out_cu.dim() == 1 && out_cu.numel() >= 1, "packkit::", op,
                  ": out_cu_seqlens must be 1-D int32 [num_cu_seqlens >= 1]");
  const int64_t num_cu = out_cu.numel();
  check_layout_args(seg_length, bin_offsets, rows.first, rows.second, flat, num_cu);
  check_output(out_cu, op, "out_cu_seqlens", input_ids, ScalarType::Int, {num_cu});
  check_output(out_cu_seg, op, "out_cu_seg", input_ids, ScalarType::Int, {num_cu - 1});
  check_disjoint(op,
                 {{"out_input_ids", &out_ids}, {"out_labels", &out_labels}, {"out_position_ids", &out_positions},
                  {"out_seq_idx", &out_seq_idx}, {"out_cu_seqlens", &out_cu}, {"out_cu_seg", &out_cu_seg}},
                 {{"input_ids", &input_ids}, {"labels", &label_src}, {"src_offsets", &src_offsets},
                  {"seg_seq", &seg_seq}, {"seg_start", &seg_start}, {"seg_length", &seg_length},
                  {"bin_offsets", &bin_offsets}});
  return rows;
}

// unpack_out (src_offsets given): out [num_src_tokens, *feature]; unpack_padded_out (src_offsets null):
// out [num_sequences, max_len, *feature]; packed's dtype and feature dims.
inline void check_unpack_output(const char* op, const Tensor& packed, const Tensor* src_offsets,
                                const Tensor& seg_seq, const Tensor& seg_start, const Tensor& cu_seqlens,
                                const Tensor& cu_seg, bool flat, const Tensor& out) {
  if (src_offsets) check_index_tensor(*src_offsets, op, "src_offsets", ScalarType::Long);
  check_segment_args(packed, seg_seq, seg_start, cu_seqlens, cu_seg, op);
  packed_tokens(packed, flat, op);
  const int64_t token_dims = flat ? 1 : 2, lead = src_offsets ? 1 : 2;
  STD_TORCH_CHECK(out.dim() == lead + packed.dim() - token_dims, "packkit::", op, ": out must have ",
                  lead + packed.dim() - token_dims, " dims (", src_offsets ? "[num_src_tokens" : "[num_sequences, max_len",
                  packed.dim() > token_dims ? ", *feature]" : "]", "), got ", out.dim());
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < lead; ++d) shape.push_back(out.size(d));
  for (int64_t d = token_dims; d < packed.dim(); ++d) shape.push_back(packed.size(d));
  check_output(out, op, "out", packed, packed.scalar_type(), shape);
  const Tensor& offsets = src_offsets ? *src_offsets : seg_seq;
  check_disjoint(op, {{"out", &out}}, {{"packed", &packed}, {"src_offsets", &offsets}, {"seg_seq", &seg_seq},
                                       {"seg_start", &seg_start}, {"cu_seqlens", &cu_seqlens}, {"cu_seg", &cu_seg}});
}

// Output shapes, shared by every backend. Packed: [num_rows, row_len, *feature] ([row_len, *feature] if
// flat), the feature dims those of `src` after its token dim.
inline std::vector<int64_t> packed_shape(const Tensor& src, int64_t num_rows, int64_t row_len, bool flat) {
  std::vector<int64_t> shape;
  if (!flat) shape.push_back(num_rows);
  shape.push_back(row_len);
  for (int64_t d = 1; d < src.dim(); ++d) shape.push_back(src.size(d));
  return shape;
}

// Unpacked: [*leading, *feature of packed] (packed's token dims: 1 if flat, else 2).
inline std::vector<int64_t> unpacked_shape(const Tensor& packed, std::vector<int64_t> leading, bool flat) {
  for (int64_t d = flat ? 1 : 2; d < packed.dim(); ++d) leading.push_back(packed.size(d));
  return leading;
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
