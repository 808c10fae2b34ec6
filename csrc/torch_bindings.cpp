// Every packkit op schema, defined once, each beside the kernels that implement it.
// Built against the LibTorch stable ABI (TORCH_TARGET_VERSION = 2.10): one binary for torch >= 2.10.
#include <torch/csrc/stable/library.h>

#include "ops/ops.hpp"

STABLE_TORCH_LIBRARY(packkit, m) {
  // Bin-packing plan of `lengths` into rows of `capacity`, as CSR: segments (source sequence,
  // start, length) in row order, and bin_offsets [num_bins + 1]. Output sizes depend on the data.
  m.def(
      "plan(Tensor lengths, int capacity, str algorithm=\"obfd\", str overlong=\"error\", int dp_size=1, "
      "float cost_a=1.0, float cost_b=0.0) -> (Tensor seg_seq, Tensor seg_start, Tensor seg_length, "
      "Tensor bin_offsets)");

  // --- Pack op family (semantics: tests/pack_reference.py) ---------------------------------------
  // Plan contract. The CPU ops validate the plan against the data and raise on any inconsistency.
  // The CUDA and Triton ops check only metadata on the host (no sync) and bound every device read and
  // write: an inconsistent plan gives unspecified values but never an access outside the tensors, so
  // it cannot fault the CUDA context. Detect it with packkit.check_plan (host, raises) or
  // packkit.check_plan(..., sync=False) (a device status tensor, no sync). packkit.pack_sequences and
  // the collators validate every plan on the host before launching.
  // Output segments of a plan laid out in rows: cu_seqlens int32 [num_cu_seqlens] (flash-attn
  // varlen format; each row's padding tail is its own segment) and cu_seg int32 [num_cu_seqlens - 1]
  // (the plan segment behind each output segment, -1 for padding). flat: one row of row_len tokens.
  // num_cu_seqlens comes from the host-side plan, so no device value is ever read back. Sizes are
  // SymInt so torch.compile(dynamic=True) keeps them symbolic (no recompile per batch shape).
  m.def(
      "layout(Tensor seg_length, Tensor bin_offsets, SymInt num_rows, SymInt row_len, bool flat, SymInt num_cu_seqlens) "
      "-> (Tensor cu_seqlens, Tensor cu_seg)");
  // Scatter src [T_src, *feature] (any dtype) into [num_rows, row_len, *feature] (or [row_len, *feature]
  // if flat); padding gets pad_value; first_value, if given, replaces each segment's first token.
  m.def(
      "pack(Tensor src, Tensor src_offsets, Tensor seg_seq, Tensor seg_start, Tensor cu_seqlens, Tensor cu_seg, "
      "SymInt num_rows, SymInt row_len, bool flat, float pad_value=0.0, float? first_value=None) -> Tensor");
  // The common training batch in one call (layout + one fused pass on CUDA): input_ids, labels
  // (input_ids if None; padding and, with mask_first_label, each segment's first label = ignore_index),
  // position_ids int64 (restart at position_start in every segment, padding tails included), seq_idx
  // int32 (the output segment of each token) and cu_seqlens.
  m.def(
      "pack_batch(Tensor input_ids, Tensor? labels, Tensor src_offsets, Tensor seg_seq, Tensor seg_start, "
      "Tensor seg_length, Tensor bin_offsets, SymInt num_rows, SymInt row_len, bool flat, SymInt num_cu_seqlens, "
      "int pad_id=0, int ignore_index=-100, bool mask_first_label=True, int position_start=0) -> "
      "(Tensor input_ids, Tensor labels, Tensor position_ids, Tensor seq_idx, Tensor cu_seqlens)");
  // Inverse of pack: packed [rows, row_len, *f] (or [T, *f] if flat) back to source order, flat
  // [num_src_tokens, *f] or padded [num_sequences, max_len, *f]; tokens no segment covers get pad_value.
  m.def(
      "unpack(Tensor packed, Tensor src_offsets, Tensor seg_seq, Tensor seg_start, Tensor cu_seqlens, "
      "Tensor cu_seg, bool flat, SymInt num_src_tokens, float pad_value=0.0) -> Tensor");
  m.def(
      "unpack_padded(Tensor packed, Tensor seg_seq, Tensor seg_start, Tensor cu_seqlens, Tensor cu_seg, "
      "bool flat, SymInt num_sequences, SymInt max_len, float pad_value=0.0) -> Tensor");

  // --- Out-variants: the same ops writing into outputs the caller owns (buffer reuse, CUDA graphs) ---
  // Each writes exactly what its functional op returns, bit for bit (the functional op allocates and
  // calls it). Sizes come from the outputs' shapes: num_rows/row_len from out ([num_rows, row_len, *f]
  // or [row_len, *f] if flat), num_cu_seqlens from len(cu_seqlens), num_src_tokens / num_sequences,
  // max_len from unpack outputs. Every output is checked before anything is written: exact shape,
  // dtype, device, contiguous, and no memory shared with an input or another output (clear error
  // otherwise). Every element of every output is overwritten, so a reused buffer needs no clearing.
  // On a data error (CPU plan validation) outputs may be partly written.
  m.def(
      "layout_out(Tensor seg_length, Tensor bin_offsets, SymInt num_rows, SymInt row_len, bool flat, "
      "Tensor(a!) cu_seqlens, Tensor(b!) cu_seg) -> ()");
  m.def(
      "pack_out(Tensor src, Tensor src_offsets, Tensor seg_seq, Tensor seg_start, Tensor cu_seqlens, Tensor cu_seg, "
      "bool flat, Tensor(a!) out, float pad_value=0.0, float? first_value=None) -> ()");
  // Outputs in pack_batch's order plus cu_seg (the layout's owner array, which unpack needs).
  m.def(
      "pack_batch_out(Tensor input_ids, Tensor? labels, Tensor src_offsets, Tensor seg_seq, Tensor seg_start, "
      "Tensor seg_length, Tensor bin_offsets, bool flat, Tensor(a!) out_input_ids, Tensor(b!) out_labels, "
      "Tensor(c!) out_position_ids, Tensor(d!) out_seq_idx, Tensor(e!) out_cu_seqlens, Tensor(f!) out_cu_seg, "
      "int pad_id=0, int ignore_index=-100, bool mask_first_label=True, int position_start=0) -> ()");
  m.def(
      "unpack_out(Tensor packed, Tensor src_offsets, Tensor seg_seq, Tensor seg_start, Tensor cu_seqlens, "
      "Tensor cu_seg, bool flat, Tensor(a!) out, float pad_value=0.0) -> ()");
  m.def(
      "unpack_padded_out(Tensor packed, Tensor seg_seq, Tensor seg_start, Tensor cu_seqlens, Tensor cu_seg, "
      "bool flat, Tensor(a!) out, float pad_value=0.0) -> ()");

  // --- Context parallelism (issue 25; context_parallel_op.cpp / .cu, Triton: triton_cp_shard) --------
  // One CP rank's shard of a flat packed row in one pass (pad + split + shift labels; semantics:
  // tests/cp_reference.py). cu_seqlens int32 [S + 1] covers the row (each document and padding tail a
  // segment). zigzag: cu_seqlens_padded int32 [S + 1] has every segment padded to a multiple of
  // 2*cp_size (TE's THD format) and out_len = cu_seqlens_padded[-1] / cp_size; rank r keeps chunks r and
  // 2*cp_size-1-r of every segment. contiguous (zigzag=False): cu_seqlens_padded is ignored, the row is
  // padded at its end to cp_size * out_len and rank r keeps the r-th slice. Returns input_ids (pad_id on
  // padding), shift_labels (labels[i+1] inside a segment, ignore_index at each segment's last token and
  // on padding), position_ids (the source's; padding continues its segment's count; end padding counts
  // from 0), src_index int64 (source token or -1) and seg_idx int32 (segment; S for end padding).
  // out_len comes from the host: no device value is read back.
  // Fused pack + shard (seg_src given, position_ids None): input_ids/labels are the UNPACKED flat source
  // and seg_src int64 [S] is where each segment of cu_seqlens starts in it (-1: a padding segment), so the
  // packed row is never built; positions are position_start + the offset in the segment and a real
  // segment's first label is first_label when given (pack_batch's semantics); src_index stays the
  // packed-row position. See context_parallel.hpp.
  m.def(
      "cp_shard(Tensor input_ids, Tensor labels, Tensor? position_ids, Tensor cu_seqlens, Tensor cu_seqlens_padded, "
      "int cp_size, int cp_rank, bool zigzag, SymInt out_len, int pad_id=0, int ignore_index=-100, "
      "Tensor? seg_src=None, int position_start=0, int? first_label=None) -> "
      "(Tensor input_ids, Tensor labels, Tensor shift_labels, Tensor position_ids, Tensor src_index, Tensor seg_idx)");
  // --- end context parallelism --------------------------------------------------------------------

  // --- Shared-prefix (tree) packing (issue 30; tree_pack_op.cpp / .cu, Triton: triton_tree_pack) ------------
  // A packed prefix forest in one pass (semantics: tests/tree_pack_reference.py, index math: tree_pack.hpp).
  // input_ids / labels: the flat source. Nodes (int64 [M]): node_src (first source token), node_dst (flat output
  // offset), node_len, node_pos (position id of the first token: the ancestors' tokens), node_end (row-relative
  // end of the node's subtree); row_offsets int64 [num_rows + 1] (CSR: each row's nodes, back to back from its
  // start). Returns [num_rows, row_len] input_ids (pad_id on padding), labels (input_ids if None; ignore_index on
  // padding), position_ids int64 (node_pos + offset; a padding tail counts from 0), node_idx int32 (-1 on
  // padding), subtree_end int32 (query q sees key k iff k <= q < subtree_end[k]; row_len on padding) and
  // cu_seqlens int32 [M + num_rows + 1] (every node, then each row's padding tail). Sizes come from the host.
  m.def(
      "tree_pack(Tensor input_ids, Tensor? labels, Tensor node_src, Tensor node_dst, Tensor node_len, Tensor node_pos, "
      "Tensor node_end, Tensor row_offsets, SymInt num_rows, SymInt row_len, int pad_id=0, int ignore_index=-100) -> "
      "(Tensor input_ids, Tensor labels, Tensor position_ids, Tensor node_idx, Tensor subtree_end, Tensor cu_seqlens)");
}

STABLE_TORCH_LIBRARY_IMPL(packkit, CPU, m) {
  m.impl("plan", TORCH_BOX(&packkit::ops::plan_cpu));
  m.impl("layout", TORCH_BOX(&packkit::ops::layout_cpu));
  m.impl("pack", TORCH_BOX(&packkit::ops::pack_cpu));
  m.impl("pack_batch", TORCH_BOX(&packkit::ops::pack_batch_cpu));
  m.impl("unpack", TORCH_BOX(&packkit::ops::unpack_cpu));
  m.impl("unpack_padded", TORCH_BOX(&packkit::ops::unpack_padded_cpu));
  m.impl("layout_out", TORCH_BOX(&packkit::ops::layout_out_cpu));
  m.impl("pack_out", TORCH_BOX(&packkit::ops::pack_out_cpu));
  m.impl("pack_batch_out", TORCH_BOX(&packkit::ops::pack_batch_out_cpu));
  m.impl("unpack_out", TORCH_BOX(&packkit::ops::unpack_out_cpu));
  m.impl("unpack_padded_out", TORCH_BOX(&packkit::ops::unpack_padded_out_cpu));
  m.impl("cp_shard", TORCH_BOX(&packkit::ops::cp_shard_cpu));  // context parallelism
  m.impl("tree_pack", TORCH_BOX(&packkit::ops::tree_pack_cpu));  // shared-prefix packing
}
