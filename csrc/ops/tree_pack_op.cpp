// CPU implementation of packkit::tree_pack: a packed prefix forest (shared-prefix packing) in one pass. Index
// math and checks in tree_pack.hpp; semantics in tests/tree_pack_reference.py. The CPU op validates the data
// (every node inside the source, the rows laid out back to back, subtree ends inside their row) and raises
// instead of reading or writing out of bounds.
#include <tuple>

#include <torch/csrc/stable/ops.h>

#include "ops.hpp"
#include "pack_checks.hpp"
#include "tree_pack.hpp"

namespace packkit::ops {

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> tree_pack_cpu(
    const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& node_src, const Tensor& node_dst,
    const Tensor& node_len, const Tensor& node_pos, const Tensor& node_end, const Tensor& row_offsets,
    int64_t num_rows, int64_t row_len, int64_t pad_id, int64_t ignore_index) {
  check_tree_pack_args(input_ids, labels, node_src, node_dst, node_len, node_pos, node_end, row_offsets, num_rows,
                       row_len);
  STD_TORCH_CHECK(input_ids.is_cpu(), "packkit::tree_pack: inputs must be CPU tensors here");
  const int64_t m = node_src.numel();
  const int64_t num_src = input_ids.numel();
  const int64_t* src = node_src.const_data_ptr<int64_t>();
  const int64_t* dst = node_dst.const_data_ptr<int64_t>();
  const int64_t* len = node_len.const_data_ptr<int64_t>();
  const int64_t* npos = node_pos.const_data_ptr<int64_t>();
  const int64_t* nend = node_end.const_data_ptr<int64_t>();
  const int64_t* ro = row_offsets.const_data_ptr<int64_t>();
  // Data checks: the layout the index math trusts.
  STD_TORCH_CHECK(ro[0] == 0 && ro[num_rows] == m, "packkit::tree_pack: row_offsets must run from 0 to the ", m,
                  " nodes");
  // All of row_offsets before any node read: a later entry out of order (row_offsets [0, 100, 3] with 3 nodes)
  // would otherwise walk row 0 past the node tables (a segfault found by tests/test_op_bounds.py).
  for (int64_t r = 0; r < num_rows; ++r) {
    STD_TORCH_CHECK(ro[r + 1] >= ro[r], "packkit::tree_pack: row_offsets must be non-decreasing (at row ", r, ")");
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    int64_t at = r * row_len;
    for (int64_t i = ro[r]; i < ro[r + 1]; ++i) {
      STD_TORCH_CHECK(len[i] >= 0, "packkit::tree_pack: node_len[", i, "] = ", len[i], " is negative");
      STD_TORCH_CHECK(src[i] >= 0 && src[i] <= num_src - len[i], "packkit::tree_pack: node ", i, " reads source "
                      "tokens [", src[i], ", ", src[i] + len[i], ") of a ", num_src, "-token source");
      STD_TORCH_CHECK(dst[i] == at, "packkit::tree_pack: node ", i, " must start at ", at, " (nodes of row ", r,
                      " are laid out back to back from the row start), got node_dst ", dst[i]);
      at += len[i];
      STD_TORCH_CHECK(at <= (r + 1) * row_len, "packkit::tree_pack: row ", r, "'s nodes need more than row_len = ",
                      row_len, " tokens");
      STD_TORCH_CHECK(npos[i] >= 0, "packkit::tree_pack: node_pos[", i, "] = ", npos[i], " is negative");
      STD_TORCH_CHECK(nend[i] >= at - r * row_len && nend[i] <= row_len, "packkit::tree_pack: node_end[", i, "] = ",
                      nend[i], " must lie in [the node's end ", at - r * row_len, ", row_len ", row_len, "]");
    }
  }
  const Tensor& label_src = labels.has_value() ? *labels : input_ids;
  const TreePackOutputs out(input_ids, label_src, num_rows, row_len, m);
  int32_t* cu = out.cu.mutable_data_ptr<int32_t>();
  int64_t* pos = out.pos.mutable_data_ptr<int64_t>();
  int32_t* node = out.node.mutable_data_ptr<int32_t>();
  int32_t* end = out.end.mutable_data_ptr<int32_t>();
  dispatch_tree_pack_types(input_ids, label_src, [&](auto id_tag, auto label_tag) {
    using Id = decltype(id_tag);
    using Label = decltype(label_tag);
    const Id* ids = input_ids.const_data_ptr<Id>();
    const Label* lab = label_src.const_data_ptr<Label>();
    Id* out_ids = out.ids.mutable_data_ptr<Id>();
    Label* out_lab = out.labels.mutable_data_ptr<Label>();
    for (int64_t r = 0; r < num_rows; ++r) {
      int64_t at = r * row_len;
      for (int64_t i = ro[r]; i < ro[r + 1]; ++i) {
        cu[i + r] = static_cast<int32_t>(dst[i]);
        for (int64_t k = 0; k < len[i]; ++k) {
          out_ids[at + k] = ids[src[i] + k];
          out_lab[at + k] = lab[src[i] + k];
          pos[at + k] = npos[i] + k;
          node[at + k] = static_cast<int32_t>(i);
          end[at + k] = static_cast<int32_t>(nend[i]);
        }
        at += len[i];
      }
      cu[ro[r + 1] + r] = static_cast<int32_t>(at);
      for (int64_t k = at; k < (r + 1) * row_len; ++k) {  // the padding tail
        out_ids[k] = static_cast<Id>(pad_id);
        out_lab[k] = static_cast<Label>(ignore_index);
        pos[k] = k - at;
        node[k] = -1;
        end[k] = static_cast<int32_t>(row_len);
      }
    }
  });
  cu[m + num_rows] = static_cast<int32_t>(num_rows * row_len);
  return out.tuple();
}

}  // namespace packkit::ops
