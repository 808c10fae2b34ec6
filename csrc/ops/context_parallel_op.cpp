// CPU implementation of packkit::cp_shard: one context-parallel rank's shard of a flat packed row, in
// one pass (pad + split + shift labels). Index math in context_parallel.hpp; semantics and the
// plain-PyTorch reference in tests/cp_reference.py. The CPU op also validates the data (cu_seqlens,
// padded cu_seqlens, output length) and raises instead of reading out of bounds.
#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/ops.h>

#include "context_parallel.hpp"
#include "ops.hpp"
#include "pack_checks.hpp"

namespace packkit::ops {

namespace {

// Same values as cp::locate for every output position, computed segment by segment (no per-token
// search): zigzag walks each segment's two chunks, contiguous the segments overlapping the rank's slice.
// seg_src == nullptr: ids/labels/pos are the packed row. Otherwise (fused) ids/labels are the unpacked
// source (num_src tokens), segment s reads from seg_src[s] (-1: padding) and positions are computed.
template <typename Id, typename Label>
void shard_loop(const Id* ids, const Label* labels, const int64_t* pos, const int32_t* cu, const int32_t* cu_padded,
                int64_t num_segments, int64_t num_tokens, int64_t cp_size, int64_t cp_rank, bool zigzag,
                int64_t out_len, int64_t pad_id, int64_t ignore_index, const int64_t* seg_src, int64_t position_start,
                std::optional<int64_t> first_label, Id* out_ids, Label* out_split, Label* out_labels,
                int64_t* out_pos, int64_t* out_src, int32_t* out_seg) {
  const Label ignore = static_cast<Label>(ignore_index);
  // Positions [j, j + count) are tokens [first, first + count) of segment s (offsets inside it).
  auto emit = [&](int64_t j, int64_t s, int64_t first, int64_t count) {
    const int64_t begin = s < num_segments ? int64_t{cu[s]} : num_tokens;
    const int64_t len = s < num_segments ? int64_t{cu[s + 1]} - begin : 0;
    const int64_t real = std::clamp<int64_t>(len - first, 0, count);
    if (seg_src == nullptr) {
      for (int64_t k = 0; k < real; ++k) {
        const int64_t src = begin + first + k;
        out_src[j + k] = src;
        out_seg[j + k] = static_cast<int32_t>(s);
        out_ids[j + k] = ids[src];
        out_split[j + k] = labels[src];
        out_pos[j + k] = pos[src];
        out_labels[j + k] = first + k + 1 < len ? labels[src + 1] : ignore;
      }
    } else {
      const int64_t from = s < num_segments ? seg_src[s] : -1;  // the segment's first token in the source
      for (int64_t k = 0; k < real; ++k) {
        const int64_t o = first + k;  // offset in the segment
        out_src[j + k] = begin + o;
        out_seg[j + k] = static_cast<int32_t>(s);
        out_pos[j + k] = position_start + o;
        if (from < 0) {  // a padding segment of the packed row
          out_ids[j + k] = static_cast<Id>(pad_id);
          out_split[j + k] = ignore;
          out_labels[j + k] = ignore;
          continue;
        }
        const int64_t q = from + o;
        out_ids[j + k] = ids[q];
        out_split[j + k] = o == 0 && first_label ? static_cast<Label>(*first_label) : labels[q];
        out_labels[j + k] = o + 1 < len ? labels[q + 1] : ignore;
      }
    }
    const int64_t base = len <= 0 ? 0 : seg_src == nullptr ? pos[begin + len - 1] + 1 : position_start + len;
    for (int64_t k = real; k < count; ++k) {
      out_src[j + k] = -1;
      out_seg[j + k] = static_cast<int32_t>(s);
      out_ids[j + k] = static_cast<Id>(pad_id);
      out_split[j + k] = ignore;
      out_pos[j + k] = base + (first + k - len);
      out_labels[j + k] = ignore;
    }
  };
  if (zigzag) {
    for (int64_t s = 0; s < num_segments; ++s) {
      const int64_t chunk = (int64_t{cu_padded[s + 1]} - cu_padded[s]) / (2 * cp_size);
      const int64_t j = cu_padded[s] / cp_size;
      emit(j, s, cp_rank * chunk, chunk);
      emit(j + chunk, s, (2 * cp_size - 1 - cp_rank) * chunk, chunk);
    }
    return;
  }
  const int64_t lo = cp_rank * out_len, hi = lo + out_len;
  int64_t j = 0;
  if (num_segments >= 1 && lo < num_tokens) {
    for (int64_t s = cp::segment_of(cu, num_segments, lo); s < num_segments && cu[s] < hi; ++s) {
      const int64_t a = std::max<int64_t>(cu[s], lo), b = std::min<int64_t>(cu[s + 1], hi);
      if (b > a) {
        emit(j, s, a - cu[s], b - a);
        j += b - a;
      }
    }
  }
  if (j < out_len) emit(j, num_segments, lo + j - num_tokens, out_len - j);  // end padding: positions from 0
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cp_shard_cpu(
    const Tensor& input_ids, const Tensor& labels, const std::optional<Tensor>& position_ids, const Tensor& cu_seqlens,
    const Tensor& cu_seqlens_padded, int64_t cp_size, int64_t cp_rank, bool zigzag, int64_t out_len, int64_t pad_id,
    int64_t ignore_index, const std::optional<Tensor>& seg_src, int64_t position_start,
    std::optional<int64_t> first_label) {
  check_cp_shard_args(input_ids, labels, position_ids, cu_seqlens, cu_seqlens_padded, cp_size, cp_rank, out_len,
                      seg_src, first_label);
  STD_TORCH_CHECK(input_ids.is_cpu(), "packkit::cp_shard: inputs must be CPU tensors here");
  const int64_t num_segments = cu_seqlens.numel() - 1;
  const int32_t* cu = cu_seqlens.const_data_ptr<int32_t>();
  const int32_t* cup = cu_seqlens_padded.const_data_ptr<int32_t>();
  const int64_t* from = seg_src ? seg_src->const_data_ptr<int64_t>() : nullptr;
  // Fused: the packed row's length is cu[S] (the source may hold more tokens: dropped ones, or fewer rows).
  const int64_t num_tokens = from ? int64_t{cu[num_segments]} : input_ids.numel();
  const int64_t num_src = input_ids.numel();
  // Data checks (the CPU has the data): the layout the index math trusts.
  STD_TORCH_CHECK(cu[0] == 0 && cu[num_segments] == num_tokens,
                  "packkit::cp_shard: cu_seqlens must run from 0 to the row's ", num_tokens, " tokens");
  STD_TORCH_CHECK(cup[0] == 0, "packkit::cp_shard: cu_seqlens_padded must start at 0");
  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t len = int64_t{cu[s + 1]} - cu[s];
    STD_TORCH_CHECK(len >= 0, "packkit::cp_shard: cu_seqlens must be non-decreasing (at ", s, ")");
    if (from) {
      STD_TORCH_CHECK(from[s] >= -1 && (from[s] < 0 || from[s] <= num_src - len), "packkit::cp_shard: seg_src[", s,
                      "] = ", from[s], " puts the segment's ", len, " tokens outside the ", num_src,
                      "-token source (or is < -1)");
    }
    if (zigzag) {
      const int64_t padded = int64_t{cup[s + 1]} - cup[s];
      STD_TORCH_CHECK(padded >= len && padded % (2 * cp_size) == 0, "packkit::cp_shard: segment ", s, " has ", len,
                      " tokens but its padded length ", padded, " is not a multiple of 2*cp_size >= it");
    }
  }
  if (zigzag) {
    STD_TORCH_CHECK(int64_t{cup[num_segments]} == out_len * cp_size, "packkit::cp_shard: out_len must be "
                    "cu_seqlens_padded[-1] / cp_size = ", cup[num_segments] / cp_size, ", got ", out_len);
  } else {
    STD_TORCH_CHECK(out_len * cp_size >= num_tokens, "packkit::cp_shard: out_len * cp_size must cover the row's ",
                    num_tokens, " tokens, got ", out_len, " * ", cp_size);
  }
  const CpShardOutputs out(input_ids, labels, out_len);
  const int64_t* p = position_ids ? position_ids->const_data_ptr<int64_t>() : nullptr;
  dispatch_cp_shard_types(input_ids, labels, [&](auto id_tag, auto label_tag) {
    using Id = decltype(id_tag);
    using Label = decltype(label_tag);
    shard_loop<Id, Label>(input_ids.const_data_ptr<Id>(), labels.const_data_ptr<Label>(), p, cu, cup, num_segments,
                          num_tokens, cp_size, cp_rank, zigzag, out_len, pad_id, ignore_index, from, position_start,
                          first_label, out.ids.mutable_data_ptr<Id>(), out.split.mutable_data_ptr<Label>(),
                          out.labels.mutable_data_ptr<Label>(), out.pos.mutable_data_ptr<int64_t>(),
                          out.src.mutable_data_ptr<int64_t>(), out.seg.mutable_data_ptr<int32_t>());
  });
  return out.tuple();
}

}  // namespace packkit::ops
