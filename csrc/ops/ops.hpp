// Declarations of every op implementation; schemas live in csrc/torch_bindings.cpp.
#pragma once
#include <optional>
#include <string>
#include <tuple>

#include <torch/csrc/stable/tensor.h>

namespace packkit::ops {

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor> plan_cpu(
    const torch::stable::Tensor& lengths, int64_t capacity, std::string algorithm, std::string overlong,
    int64_t dp_size, double cost_a, double cost_b);

// Pack op family (pack_op.cpp on CPU, pack_op.cu on CUDA; semantics in tests/pack_reference.py).
using Tensor = torch::stable::Tensor;

std::tuple<Tensor, Tensor> layout_cpu(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows,
                                      int64_t row_len, bool flat, int64_t num_cu_seqlens);
Tensor pack_cpu(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                const Tensor& cu_seqlens, const Tensor& cu_seg, int64_t num_rows, int64_t row_len, bool flat,
                double pad_value, std::optional<double> first_value);
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> pack_batch_cpu(
    const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& src_offsets, const Tensor& seg_seq,
    const Tensor& seg_start, const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len,
    bool flat, int64_t num_cu_seqlens, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
    int64_t position_start);
Tensor unpack_cpu(const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                  const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, int64_t num_src_tokens,
                  double pad_value);
Tensor unpack_padded_cpu(const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                         const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, int64_t num_sequences,
                         int64_t max_len, double pad_value);

// Out-variants: write into caller-provided outputs (checked: shape, dtype, device, contiguity, no
// overlap with inputs). The functional ops above allocate and call these, so there is one implementation.
void layout_out_cpu(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len,
                    bool flat, const Tensor& cu_seqlens, const Tensor& cu_seg);
void pack_out_cpu(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                  const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out, double pad_value,
                  std::optional<double> first_value);
void pack_batch_out_cpu(const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& src_offsets,
                        const Tensor& seg_seq, const Tensor& seg_start, const Tensor& seg_length,
                        const Tensor& bin_offsets, bool flat, const Tensor& out_input_ids, const Tensor& out_labels,
                        const Tensor& out_position_ids, const Tensor& out_seq_idx, const Tensor& out_cu_seqlens,
                        const Tensor& out_cu_seg, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
                        int64_t position_start);
void unpack_out_cpu(const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                    const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out, double pad_value);
void unpack_padded_out_cpu(const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                           const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out,
                           double pad_value);

}  // namespace packkit::ops

// --- Context parallelism (context_parallel_op.cpp / .cu; semantics in tests/cp_reference.py) ----
namespace packkit::ops {
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cp_shard_cpu(
    const Tensor& input_ids, const Tensor& labels, const std::optional<Tensor>& position_ids, const Tensor& cu_seqlens,
    const Tensor& cu_seqlens_padded, int64_t cp_size, int64_t cp_rank, bool zigzag, int64_t out_len, int64_t pad_id,
    int64_t ignore_index, const std::optional<Tensor>& seg_src, int64_t position_start,
    std::optional<int64_t> first_label);
}  // namespace packkit::ops

// --- Shared-prefix (tree) packing (tree_pack_op.cpp / .cu; semantics in tests/tree_pack_reference.py) ---
namespace packkit::ops {
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> tree_pack_cpu(
    const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& node_src, const Tensor& node_dst,
    const Tensor& node_len, const Tensor& node_pos, const Tensor& node_end, const Tensor& row_offsets,
    int64_t num_rows, int64_t row_len, int64_t pad_id, int64_t ignore_index);
}  // namespace packkit::ops
