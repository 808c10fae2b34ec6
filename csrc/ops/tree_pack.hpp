// packkit::tree_pack (shared-prefix packing): argument checks, outputs and index math shared by the CPU op
// (tree_pack_op.cpp) and the CUDA kernel (tree_pack_op.cu); the Triton kernel (triton_kernels/tree_pack.py)
// repeats the math. Semantics and the plain-PyTorch reference: tests/tree_pack_reference.py.
//
// M nodes (int64 [M] each): node i's node_len tokens start at node_src[i] in the flat source and at node_dst[i]
// in the flat [num_rows * row_len] output; node_pos[i] is the position id of its first token and node_end[i] the
// row-relative end of its subtree. row_offsets [num_rows + 1] (CSR) lists each row's nodes, laid out back to back
// from the row start; the rest of a row is padding. Outputs [num_rows, row_len]: input_ids, labels, position_ids
// (node_pos + offset; a padding tail counts from 0), node_idx int32 (-1 on padding), subtree_end int32 (the node's
// node_end; row_len on padding), and cu_seqlens int32 [M + num_rows + 1]: every node, then each row's padding
// tail (possibly empty), in flat coordinates.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include <torch/csrc/stable/ops.h>

#include "pack_checks.hpp"

#if defined(__CUDACC__)
#define PACKKIT_TREE_HD __host__ __device__ __forceinline__
#else
#define PACKKIT_TREE_HD inline
#endif

namespace packkit::ops::tree {

// Last i in [lo, hi) with key(i) <= x, or lo - 1 if none; every index read lies in [lo, hi).
template <typename Key>
PACKKIT_TREE_HD int64_t last_at_most(int64_t lo, int64_t hi, int64_t x, Key key) {
  int64_t found = lo - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (key(mid) <= x) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return found;
}

PACKKIT_TREE_HD int64_t clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Row-local node range of row r (clamped into [0, M]: an inconsistent CSR reads nothing outside the arrays).
struct Range {
  int64_t lo, hi;
};
PACKKIT_TREE_HD Range row_nodes(const int64_t* row_offsets, int64_t r, int64_t m) {
  const int64_t lo = clamp(row_offsets[r], 0, m);
  const int64_t hi = clamp(row_offsets[r + 1], lo, m);
  return {lo, hi};
}

// The cu_seqlens entry e in [0, M + R] (f(r) = row_offsets[r] + r is strictly increasing for a valid CSR).
PACKKIT_TREE_HD int64_t cu_entry(int64_t e, const int64_t* row_offsets, const int64_t* dst, const int64_t* len,
                                 int64_t m, int64_t num_rows, int64_t row_len) {
  if (e >= m + num_rows) return num_rows * row_len;
  // No rows but nodes (an inconsistent call: the CPU op refuses it): row_offsets has one entry, so there is no
  // row to search.
  if (num_rows <= 0) return 0;
  int64_t r = last_at_most(0, num_rows, e, [&](int64_t k) { return row_offsets[k] + k; });
  r = clamp(r, 0, num_rows - 1);
  const Range nodes = row_nodes(row_offsets, r, m);
  const int64_t i = e - r;
  if (i >= nodes.lo && i < nodes.hi) return dst[i];
  if (nodes.hi > nodes.lo) return dst[nodes.hi - 1] + len[nodes.hi - 1];
  return r * row_len;
}

}  // namespace packkit::ops::tree

namespace packkit::ops {

// Metadata checks (no data read, so no host sync on CUDA).
inline void check_tree_pack_args(const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& node_src,
                                 const Tensor& node_dst, const Tensor& node_len, const Tensor& node_pos,
                                 const Tensor& node_end, const Tensor& row_offsets, int64_t num_rows, int64_t row_len) {
  const char* op = "tree_pack";
  STD_TORCH_CHECK(input_ids.dim() == 1, "packkit::tree_pack: input_ids must be the flat 1-D source, got ",
                  input_ids.dim(), " dims");
  STD_TORCH_CHECK(input_ids.scalar_type() == ScalarType::Long || input_ids.scalar_type() == ScalarType::Int,
                  "packkit::tree_pack: input_ids must be int64 or int32");
  if (labels.has_value()) {
    STD_TORCH_CHECK(labels->dim() == 1 && labels->numel() == input_ids.numel(),
                    "packkit::tree_pack: labels must be 1-D with one label per source token (", input_ids.numel(), ")");
    STD_TORCH_CHECK(labels->scalar_type() == ScalarType::Long || labels->scalar_type() == ScalarType::Int,
                    "packkit::tree_pack: labels must be int64 or int32");
    check_same_device(input_ids, *labels, op, "input_ids", "labels");
    STD_TORCH_CHECK(labels->is_contiguous(), "packkit::tree_pack: inputs must be contiguous");
  }
  const Tensor* nodes[] = {&node_src, &node_dst, &node_len, &node_pos, &node_end};
  const char* names[] = {"node_src", "node_dst", "node_len", "node_pos", "node_end"};
  for (int k = 0; k < 5; ++k) {
    check_index_tensor(*nodes[k], op, names[k], ScalarType::Long);
    STD_TORCH_CHECK(nodes[k]->numel() == node_src.numel(), "packkit::tree_pack: ", names[k],
                    " must have one entry per node (", node_src.numel(), "), got ", nodes[k]->numel());
    check_same_device(input_ids, *nodes[k], op, "input_ids", names[k]);
    STD_TORCH_CHECK(nodes[k]->is_contiguous(), "packkit::tree_pack: inputs must be contiguous");
  }
  check_index_tensor(row_offsets, op, "row_offsets", ScalarType::Long);
  check_same_device(input_ids, row_offsets, op, "input_ids", "row_offsets");
  STD_TORCH_CHECK(num_rows >= 0 && row_len >= 0, "packkit::tree_pack: num_rows and row_len must be >= 0, got ",
                  num_rows, " and ", row_len);
  STD_TORCH_CHECK(row_offsets.numel() == num_rows + 1, "packkit::tree_pack: row_offsets needs num_rows + 1 = ",
                  num_rows + 1, " entries, got ", row_offsets.numel());
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  STD_TORCH_CHECK(row_len == 0 || num_rows <= kMax / row_len, "packkit::tree_pack: num_rows * row_len must fit int32"
                  " (the cu_seqlens format), got ", num_rows, " * ", row_len);
  STD_TORCH_CHECK(node_src.numel() + num_rows < kMax, "packkit::tree_pack: too many nodes for int32 cu_seqlens");
  STD_TORCH_CHECK(input_ids.is_contiguous() && row_offsets.is_contiguous(), "packkit::tree_pack: inputs must be "
                  "contiguous");
}

struct TreePackOutputs {
  Tensor ids, labels, pos, node, end, cu;
  TreePackOutputs(const Tensor& input_ids, const Tensor& label_src, int64_t num_rows, int64_t row_len, int64_t m)
      : ids(torch::stable::new_empty(input_ids, {num_rows, row_len})),
        labels(torch::stable::new_empty(label_src, {num_rows, row_len})),
        pos(torch::stable::new_empty(input_ids, {num_rows, row_len}, ScalarType::Long)),
        node(torch::stable::new_empty(input_ids, {num_rows, row_len}, ScalarType::Int)),
        end(torch::stable::new_empty(input_ids, {num_rows, row_len}, ScalarType::Int)),
        cu(torch::stable::new_empty(input_ids, {m + num_rows + 1}, ScalarType::Int)) {}
  std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> tuple() const { return {ids, labels, pos, node, end, cu}; }
};

// Calls f(Id{}, Label{}) with the element types of input_ids and the label source (int64 or int32 each).
template <typename F>
void dispatch_tree_pack_types(const Tensor& input_ids, const Tensor& label_src, F&& f) {
  const bool id64 = input_ids.scalar_type() == ScalarType::Long;
  const bool lab64 = label_src.scalar_type() == ScalarType::Long;
  if (id64 && lab64) f(int64_t{}, int64_t{});
  else if (id64) f(int64_t{}, int32_t{});
  else if (lab64) f(int32_t{}, int64_t{});
  else f(int32_t{}, int32_t{});
}

}  // namespace packkit::ops
