// CPU implementations of the pack op family: layout, pack, pack_batch, unpack, unpack_padded.
// Semantics (and the plain-PyTorch reference every backend must equal bit for bit) are in
// tests/pack_reference.py. On the CPU the data is already on the host, so every op also validates
// the plan against the data and raises instead of reading or writing out of bounds.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ops.hpp"
#include "pack_checks.hpp"

namespace packkit::ops {

namespace {

// Output segments per parallel task, so that each task moves at least ~256K tokens: small batches
// (a collator's few hundred sequences) run inline, because waking the thread pool costs more than
// the copy and, on small machines, a spinning worker steals the core the caller needs.
int64_t grain_for(int64_t num_segments, int64_t total_tokens) {
  constexpr int64_t kTokensPerTask = int64_t{1} << 18;
  if (total_tokens < 4 * kTokensPerTask || num_segments == 0) return std::max<int64_t>(num_segments, 1);
  return std::max<int64_t>(1, num_segments * kTokensPerTask / total_tokens);
}

// Packed outputs are large and written once, right after allocation: with 4 KiB pages the first-touch
// faults cost more than the copy itself (about 4x on our 2-core CI machine). Advising transparent
// huge pages on the fresh buffer, before anything touches it, makes faults 512x rarer. Advice only:
// harmless where THP is off or the range is too small.
void advise_huge_pages(const Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.mutable_data_ptr()) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.mutable_data_ptr()) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

Tensor empty_output(const Tensor& like, const std::vector<int64_t>& shape,
                    std::optional<ScalarType> dtype = std::nullopt) {
  Tensor out = torch::stable::new_empty(like, shape, dtype);
  advise_huge_pages(out);
  return out;
}

// Fills `count` elements of `elem_size` bytes with one pattern.
void fill_elements(uint8_t* dst, int64_t count, const uint8_t* pattern, size_t elem_size) {
  if (count <= 0) return;  // an empty output may have no storage: memset(nullptr, ., 0) is UB (UBSan)
  switch (elem_size) {
    case 1: std::memset(dst, pattern[0], count); return;
    case 2: { uint16_t v; std::memcpy(&v, pattern, 2); std::fill_n(reinterpret_cast<uint16_t*>(dst), count, v); return; }
    case 4: { uint32_t v; std::memcpy(&v, pattern, 4); std::fill_n(reinterpret_cast<uint32_t*>(dst), count, v); return; }
    case 8: { uint64_t v; std::memcpy(&v, pattern, 8); std::fill_n(reinterpret_cast<uint64_t*>(dst), count, v); return; }
    default:
      for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * elem_size, pattern, elem_size);
  }
}

// Data checks of a layout against the source: every real segment reads inside its sequence.
void validate_segments(const int64_t* src_offsets, int64_t num_sources, int64_t source_tokens,
                       const int64_t* seg_seq, const int64_t* seg_start, int64_t num_segments, const int32_t* cu,
                       const int32_t* cu_seg, int64_t num_cu_segments, int64_t total, const char* op) {
  STD_TORCH_CHECK(src_offsets[0] >= 0, "packkit::", op, ": src_offsets[0] must be >= 0");
  for (int64_t i = 0; i < num_sources; ++i) {
    STD_TORCH_CHECK(src_offsets[i] <= src_offsets[i + 1], "packkit::", op,
                    ": src_offsets must be non-decreasing, but src_offsets[", i, "] = ", src_offsets[i],
                    " > src_offsets[", i + 1, "] = ", src_offsets[i + 1]);
  }
  STD_TORCH_CHECK(src_offsets[num_sources] <= source_tokens, "packkit::", op,
                  ": src_offsets[-1] = ", src_offsets[num_sources],
                  " exceeds the source's ", source_tokens, " tokens");
  STD_TORCH_CHECK(cu[0] == 0 && cu[num_cu_segments] == total, "packkit::", op,
                  ": cu_seqlens must start at 0 and end at the packed token count ", total);
  for (int64_t k = 0; k < num_cu_segments; ++k) {
    const int64_t len = int64_t{cu[k + 1]} - cu[k];
    STD_TORCH_CHECK(len >= 1, "packkit::", op, ": cu_seqlens must be strictly increasing (at ", k, ")");
    const int64_t j = cu_seg[k];
    STD_TORCH_CHECK(j >= -1 && j < num_segments, "packkit::", op, ": cu_seg[", k, "] = ", j,
                    " is neither -1 (padding) nor a segment index");
    if (j < 0) continue;
    const int64_t seq = seg_seq[j];
    STD_TORCH_CHECK(seq >= 0 && seq < num_sources, "packkit::", op, ": segment ", j, " names sequence ", seq,
                    " but there are ", num_sources);
    const int64_t seq_len = src_offsets[seq + 1] - src_offsets[seq];
    STD_TORCH_CHECK(seg_start[j] >= 0 && seg_start[j] <= seq_len - len, "packkit::", op, ": segment ", j,
                    " starts at token ", seg_start[j], " with ", len, " tokens in sequence ", seq,
                    ", which has ", seq_len);
  }
}

void layout_into(const int64_t* seg_length, int64_t num_segments, const int64_t* bin_offsets, int64_t num_bins,
                 int64_t num_rows, int64_t row_len, bool flat, int32_t* cu, int32_t* cu_seg, int64_t num_cu) {
  STD_TORCH_CHECK(bin_offsets[0] == 0 && bin_offsets[num_bins] == num_segments,
                  "packkit::layout: bin_offsets must run from 0 to the number of segments (", num_segments, ")");
  // All of bin_offsets before any seg_length read: one entry out of order would otherwise walk a bin
  // past the end of seg_length (found by AddressSanitizer).
  for (int64_t bin = 0; bin < num_bins; ++bin) {
    STD_TORCH_CHECK(bin_offsets[bin] <= bin_offsets[bin + 1], "packkit::layout: bin_offsets must be non-decreasing, "
                    "but bin_offsets[", bin, "] = ", bin_offsets[bin], " > bin_offsets[", bin + 1, "] = ",
                    bin_offsets[bin + 1]);
  }
  int64_t k = 0;
  auto emit = [&](int64_t start, int32_t owner) {
    if (k < num_cu - 1) {
      cu[k] = static_cast<int32_t>(start);
      cu_seg[k] = owner;
    }
    ++k;
  };
  const int64_t rows = flat ? 1 : num_rows;
  int64_t pos = 0;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t row_end = (b + 1) * row_len;
    const int64_t first_bin = flat ? 0 : b, last_bin = flat ? num_bins : std::min(b + 1, num_bins);
    for (int64_t bin = first_bin; bin < last_bin; ++bin) {
      for (int64_t j = bin_offsets[bin]; j < bin_offsets[bin + 1]; ++j) {
        STD_TORCH_CHECK(seg_length[j] >= 1, "packkit::layout: segment ", j, " has length ", seg_length[j],
                        "; segment lengths must be >= 1");
        emit(pos, static_cast<int32_t>(j));
        // Compared before adding: a huge length must not overflow pos.
        STD_TORCH_CHECK(seg_length[j] <= row_end - pos, "packkit::layout: ", flat ? "the plan's tokens do not fit" : "bin ",
                        flat ? "" : std::to_string(bin), flat ? " in row_len = " : " does not fit in row_len = ",
                        row_len);
        pos += seg_length[j];
      }
    }
    if (pos < row_end) emit(pos, -1);
    pos = row_end;
  }
  STD_TORCH_CHECK(k == num_cu - 1, "packkit::layout: this plan and layout have ", k,
                  " output segments, so num_cu_seqlens must be ", k + 1, ", got ", num_cu);
  cu[k] = static_cast<int32_t>(pos);
}

// Every element of `out` = pad_value (the unpack outputs start so: tokens no segment covers keep it).
void fill_with(const Tensor& out, double pad_value) {
  const auto pad = value_bytes(pad_value, out.scalar_type());
  fill_elements(static_cast<uint8_t*>(out.mutable_data_ptr()), out.numel(), pad.data(), out.element_size());
}

Tensor contiguous_cpu(const Tensor& t, const char* op, const char* name) {
  STD_TORCH_CHECK(t.is_cpu(), "packkit::", op, ": ", name, " must be a CPU tensor here");
  return torch::stable::contiguous(t);
}

// Output segments in the order their sources lie in src (a counting sort by sequence; padding first), or
// an empty vector where plan order is kept: inputs under 1M elements (the threshold at which pack goes
// multi-threaded; below it, e.g. a 32K-token training batch, the op stays exactly as it was) and plans over
// a small subset of many sequences (the count array would dwarf the work).
std::vector<int64_t> source_order(const int64_t* seg_seq, const int32_t* cu_seg, int64_t num_cu_segments,
                                  int64_t num_sources, int64_t total_elements) {
  constexpr int64_t kMinElements = int64_t{1} << 20;
  if (total_elements < kMinElements || num_sources > 4 * num_cu_segments + 1024) return {};
  auto bucket = [&](int64_t k) { return cu_seg[k] < 0 ? int64_t{0} : seg_seq[cu_seg[k]] + 1; };
  std::vector<int64_t> next(num_sources + 2, 0), order(num_cu_segments);
  for (int64_t k = 0; k < num_cu_segments; ++k) ++next[bucket(k) + 1];
  for (int64_t b = 1; b < num_sources + 2; ++b) next[b] += next[b - 1];
  for (int64_t k = 0; k < num_cu_segments; ++k) order[next[bucket(k)]++] = k;
  return order;
}

// Shared body of pack: one output segment at a time, copying whole token records. The output ranges of
// the segments are disjoint (cu_seqlens is strictly increasing), so any order and any split over threads
// writes the same bytes, without data races.
constexpr int kPrefetchLines = 4;
void pack_records(const uint8_t* src, const int64_t* src_offsets, int64_t num_sources, const int64_t* seg_seq,
                  const int64_t* seg_start, const int32_t* cu, const int32_t* cu_seg, int64_t num_cu_segments,
                  size_t elem_size, int64_t features, const uint8_t* pad, const uint8_t* first, uint8_t* out) {
  const size_t record = elem_size * features;
  const int64_t total_elements = int64_t{cu[num_cu_segments]} * features;
  const int64_t grain = grain_for(num_cu_segments, total_elements);
  auto source = [&](int64_t j) { return src + (src_offsets[seg_seq[j]] + seg_start[j]) * record; };
  auto copy_segment = [&](int64_t k) {
    const int64_t a = cu[k], len = int64_t{cu[k + 1]} - a;
    const int64_t j = cu_seg[k];
    uint8_t* dst = out + a * record;
    if (j < 0) {
      fill_elements(dst, len * features, pad, elem_size);
      return;
    }
    std::memcpy(dst, source(j), len * record);
    if (first) fill_elements(dst, features, first, elem_size);
  };
  // A plan reorders sequences, so in plan order each segment reads from a random place in src: a cache
  // and, on 4 KiB pages, a TLB miss that the load waits for. In source order the reads stream and the
  // scattered side is the writes, which the store buffer absorbs far better: int32 tokens 0.47 -> 0.63 of
  // a plain copy, fp32 [tokens, 8] 0.76 -> 0.93 on a 2-core EPYC VM; a tie where src is already on huge
  // pages (benchmarks/pack_cpu_notes.md).
  const std::vector<int64_t> order = source_order(seg_seq, cu_seg, num_cu_segments, num_sources, total_elements);
  if (!order.empty()) {
    torch::stable::parallel_for(0, num_cu_segments, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        // The next destination is the random access now: start its first line's ownership early.
        if (i + 1 < end) __builtin_prefetch(out + int64_t{cu[order[i + 1]]} * record, 1, 0);
        copy_segment(order[i]);
      }
    });
    return;
  }
  torch::stable::parallel_for(0, num_cu_segments, grain, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      // Small inputs keep plan order: fetching the next segment's first lines while this one copies hides
      // most of its miss (about 10% of the op on a 2-core EPYC VM; more lines or more segments ahead
      // gained nothing there).
      if (k + 1 < end && cu_seg[k + 1] >= 0) {
        const uint8_t* next = source(cu_seg[k + 1]);
        for (int line = 0; line < kPrefetchLines; ++line) __builtin_prefetch(next + 64 * line, 0, 0);
      }
      copy_segment(k);
    }
  });
}

// --- one implementation per op, writing into outputs the caller checked ---------------------------
void layout_impl(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len, bool flat,
                 const Tensor& cu_seqlens, const Tensor& cu_seg) {
  const Tensor lengths = contiguous_cpu(seg_length, "layout", "seg_length");
  const Tensor offsets = contiguous_cpu(bin_offsets, "layout", "bin_offsets");
  layout_into(lengths.const_data_ptr<int64_t>(), lengths.numel(), offsets.const_data_ptr<int64_t>(),
              offsets.numel() - 1, num_rows, row_len, flat, cu_seqlens.mutable_data_ptr<int32_t>(),
              cu_seg.mutable_data_ptr<int32_t>(), cu_seqlens.numel());
}

void pack_impl(const char* op, const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq,
               const Tensor& seg_start, const Tensor& cu_seqlens, const Tensor& cu_seg, int64_t num_rows,
               int64_t row_len, bool flat, double pad_value, std::optional<double> first_value, const Tensor& out) {
  check_index_tensor(src_offsets, op, "src_offsets", ScalarType::Long);
  check_segment_args(src, seg_seq, seg_start, cu_seqlens, cu_seg, op);
  const int64_t total = checked_total_tokens(num_rows, row_len, flat, op);
  const Tensor s = contiguous_cpu(src, op, "src"), offs = contiguous_cpu(src_offsets, op, "src_offsets");
  const Tensor sq = contiguous_cpu(seg_seq, op, "seg_seq"), st = contiguous_cpu(seg_start, op, "seg_start");
  const Tensor cu = contiguous_cpu(cu_seqlens, op, "cu_seqlens"), cs = contiguous_cpu(cu_seg, op, "cu_seg");
  STD_TORCH_CHECK(offs.numel() >= 1, "packkit::", op, ": src_offsets needs num_sequences + 1 >= 1 entries");
  validate_segments(offs.const_data_ptr<int64_t>(), offs.numel() - 1, s.size(0), sq.const_data_ptr<int64_t>(),
                    st.const_data_ptr<int64_t>(), sq.numel(), cu.const_data_ptr<int32_t>(),
                    cs.const_data_ptr<int32_t>(), cs.numel(), total, op);
  const auto pad = value_bytes(pad_value, s.scalar_type());
  const auto first = value_bytes(first_value.value_or(0.0), s.scalar_type());
  pack_records(static_cast<const uint8_t*>(s.const_data_ptr()), offs.const_data_ptr<int64_t>(), offs.numel() - 1,
               sq.const_data_ptr<int64_t>(), st.const_data_ptr<int64_t>(), cu.const_data_ptr<int32_t>(),
               cs.const_data_ptr<int32_t>(), cs.numel(), s.element_size(), feature_numel(s, 1), pad.data(),
               first_value ? first.data() : nullptr, static_cast<uint8_t*>(out.mutable_data_ptr()));
}

void unpack_impl(const char* op, const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq,
                 const Tensor& seg_start, const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat,
                 double pad_value, const Tensor& out) {
  const int64_t num_src_tokens = out.size(0);
  const int64_t total = packed_tokens(packed, flat, op);
  const Tensor p = contiguous_cpu(packed, op, "packed"), offs = contiguous_cpu(src_offsets, op, "src_offsets");
  const Tensor sq = contiguous_cpu(seg_seq, op, "seg_seq"), st = contiguous_cpu(seg_start, op, "seg_start");
  const Tensor cu = contiguous_cpu(cu_seqlens, op, "cu_seqlens"), cs = contiguous_cpu(cu_seg, op, "cu_seg");
  STD_TORCH_CHECK(offs.numel() >= 1, "packkit::", op, ": src_offsets needs num_sequences + 1 >= 1 entries");
  validate_segments(offs.const_data_ptr<int64_t>(), offs.numel() - 1, num_src_tokens, sq.const_data_ptr<int64_t>(),
                    st.const_data_ptr<int64_t>(), sq.numel(), cu.const_data_ptr<int32_t>(),
                    cs.const_data_ptr<int32_t>(), cs.numel(), total, op);
  const int64_t token_dims = flat ? 1 : 2, features = feature_numel(p, token_dims);
  fill_with(out, pad_value);
  const size_t record = p.element_size() * features;
  const uint8_t* in = static_cast<const uint8_t*>(p.const_data_ptr());
  uint8_t* o = static_cast<uint8_t*>(out.mutable_data_ptr());
  const int32_t* c = cu.const_data_ptr<int32_t>();
  const int32_t* owner = cs.const_data_ptr<int32_t>();
  const int64_t *so = offs.const_data_ptr<int64_t>(), *ss = sq.const_data_ptr<int64_t>(),
                *sst = st.const_data_ptr<int64_t>();
  torch::stable::parallel_for(0, cs.numel(), grain_for(cs.numel(), int64_t{c[cs.numel()]} * features),
                              [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t j = owner[k];
      if (j < 0) continue;
      std::memcpy(o + (so[ss[j]] + sst[j]) * record, in + int64_t{c[k]} * record,
                  (int64_t{c[k + 1]} - c[k]) * record);
    }
  });
}

void unpack_padded_impl(const char* op, const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                        const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, double pad_value,
                        const Tensor& out) {
  const int64_t num_sequences = out.size(0), max_len = out.size(1);
  const int64_t total = packed_tokens(packed, flat, op);
  const Tensor p = contiguous_cpu(packed, op, "packed");
  const Tensor sq = contiguous_cpu(seg_seq, op, "seg_seq");
  const Tensor st = contiguous_cpu(seg_start, op, "seg_start");
  const Tensor cu = contiguous_cpu(cu_seqlens, op, "cu_seqlens");
  const Tensor cs = contiguous_cpu(cu_seg, op, "cu_seg");
  const int32_t* c = cu.const_data_ptr<int32_t>();
  const int32_t* owner = cs.const_data_ptr<int32_t>();
  const int64_t *ss = sq.const_data_ptr<int64_t>(), *sst = st.const_data_ptr<int64_t>();
  STD_TORCH_CHECK(c[0] == 0 && c[cs.numel()] == total, "packkit::", op, ": cu_seqlens must start at 0 and end at "
                  "the packed token count ", total);
  for (int64_t k = 0; k < cs.numel(); ++k) {
    STD_TORCH_CHECK(c[k] < c[k + 1], "packkit::", op, ": cu_seqlens must be strictly increasing (at ", k, ")");
    const int64_t j = owner[k];
    STD_TORCH_CHECK(j >= -1 && j < sq.numel(), "packkit::", op, ": cu_seg[", k, "] = ", j,
                    " is neither -1 (padding) nor a segment index");
    if (j < 0) continue;
    STD_TORCH_CHECK(ss[j] >= 0 && ss[j] < num_sequences && sst[j] >= 0, "packkit::", op, ": segment ", j,
                    " names sequence ", ss[j], " (start ", sst[j], ") but num_sequences is ", num_sequences);
  }
  const int64_t token_dims = flat ? 1 : 2, features = feature_numel(p, token_dims);
  fill_with(out, pad_value);
  const size_t record = p.element_size() * features;
  const uint8_t* in = static_cast<const uint8_t*>(p.const_data_ptr());
  uint8_t* o = static_cast<uint8_t*>(out.mutable_data_ptr());
  torch::stable::parallel_for(0, cs.numel(), grain_for(cs.numel(), int64_t{c[cs.numel()]} * features),
                              [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t j = owner[k];
      if (j < 0 || sst[j] >= max_len) continue;
      const int64_t n = std::min<int64_t>(int64_t{c[k + 1]} - c[k], max_len - sst[j]);
      std::memcpy(o + (ss[j] * max_len + sst[j]) * record, in + int64_t{c[k]} * record, n * record);
    }
  });
}

}  // namespace

// --- out-variants: check the caller's outputs, then the shared implementation ----------------------
void layout_out_cpu(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len,
                    bool flat, const Tensor& cu_seqlens, const Tensor& cu_seg) {
  check_layout_outputs("layout_out", seg_length, bin_offsets, num_rows, row_len, flat, cu_seqlens, cu_seg);
  layout_impl(seg_length, bin_offsets, num_rows, row_len, flat, cu_seqlens, cu_seg);
}

void pack_out_cpu(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                  const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out, double pad_value,
                  std::optional<double> first_value) {
  const auto [num_rows, row_len] = check_pack_output("pack_out", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out);
  pack_impl("pack_out", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value,
            first_value, out);
}

void pack_batch_out_cpu(const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& src_offsets,
                        const Tensor& seg_seq, const Tensor& seg_start, const Tensor& seg_length,
                        const Tensor& bin_offsets, bool flat, const Tensor& out_input_ids, const Tensor& out_labels,
                        const Tensor& out_position_ids, const Tensor& out_seq_idx, const Tensor& out_cu_seqlens,
                        const Tensor& out_cu_seg, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
                        int64_t position_start) {
  const Tensor& label_src = check_pack_batch_tokens(input_ids, labels);
  const auto [num_rows, row_len] =
      check_pack_batch_outputs(input_ids, label_src, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, flat,
                               out_input_ids, out_labels, out_position_ids, out_seq_idx, out_cu_seqlens, out_cu_seg);
  const Tensor& cu = out_cu_seqlens;
  layout_impl(seg_length, bin_offsets, num_rows, row_len, flat, cu, out_cu_seg);
  pack_impl("pack_batch", input_ids, src_offsets, seg_seq, seg_start, cu, out_cu_seg, num_rows, row_len, flat,
            static_cast<double>(pad_id), std::nullopt, out_input_ids);
  pack_impl("pack_batch", label_src, src_offsets, seg_seq, seg_start, cu, out_cu_seg, num_rows, row_len, flat,
            static_cast<double>(ignore_index),
            mask_first_label ? std::optional<double>(static_cast<double>(ignore_index)) : std::nullopt, out_labels);
  const int64_t num_cu_segments = out_cu_seg.numel();
  const int32_t* c = cu.const_data_ptr<int32_t>();
  int64_t* pos = out_position_ids.mutable_data_ptr<int64_t>();
  int32_t* doc = out_seq_idx.mutable_data_ptr<int32_t>();
  torch::stable::parallel_for(0, num_cu_segments, grain_for(num_cu_segments, c[num_cu_segments]),
                              [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      for (int64_t p = c[k], i = position_start; p < c[k + 1]; ++p, ++i) pos[p] = i;
      std::fill(doc + c[k], doc + c[k + 1], static_cast<int32_t>(k));
    }
  });
}

void unpack_out_cpu(const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                    const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out, double pad_value) {
  check_unpack_output("unpack_out", packed, &src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out);
  unpack_impl("unpack_out", packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out);
}

void unpack_padded_out_cpu(const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                           const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, const Tensor& out,
                           double pad_value) {
  check_unpack_output("unpack_padded_out", packed, nullptr, seg_seq, seg_start, cu_seqlens, cu_seg, flat, out);
  unpack_padded_impl("unpack_padded_out", packed, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out);
}

// --- functional ops: allocate (huge-page advised), then the same implementation --------------------
std::tuple<Tensor, Tensor> layout_cpu(const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows,
                                      int64_t row_len, bool flat, int64_t num_cu_seqlens) {
  check_layout_args(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens);
  Tensor cu = torch::stable::empty({num_cu_seqlens}, ScalarType::Int);
  Tensor cu_seg = torch::stable::empty({num_cu_seqlens - 1}, ScalarType::Int);
  layout_out_cpu(seg_length, bin_offsets, num_rows, row_len, flat, cu, cu_seg);
  return {cu, cu_seg};
}

Tensor pack_cpu(const Tensor& src, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                const Tensor& cu_seqlens, const Tensor& cu_seg, int64_t num_rows, int64_t row_len, bool flat,
                double pad_value, std::optional<double> first_value) {
  STD_TORCH_CHECK(src.dim() >= 1, "packkit::pack: src must be [tokens, *feature], got a 0-d tensor");
  checked_total_tokens(num_rows, row_len, flat, "pack");
  STD_TORCH_CHECK(src.is_cpu(), "packkit::pack: src must be a CPU tensor here");
  Tensor out = empty_output(src, packed_shape(src, num_rows, row_len, flat));
  pack_impl("pack", src, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, num_rows, row_len, flat, pad_value,
            first_value, out);
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> pack_batch_cpu(
    const Tensor& input_ids, const std::optional<Tensor>& labels, const Tensor& src_offsets, const Tensor& seg_seq,
    const Tensor& seg_start, const Tensor& seg_length, const Tensor& bin_offsets, int64_t num_rows, int64_t row_len,
    bool flat, int64_t num_cu_seqlens, int64_t pad_id, int64_t ignore_index, bool mask_first_label,
    int64_t position_start) {
  const Tensor& label_src = check_pack_batch_tokens(input_ids, labels);
  check_layout_args(seg_length, bin_offsets, num_rows, row_len, flat, num_cu_seqlens);
  STD_TORCH_CHECK(input_ids.is_cpu(), "packkit::pack_batch: input_ids must be a CPU tensor here");
  const std::vector<int64_t> shape = packed_shape(input_ids, num_rows, row_len, flat);
  Tensor ids = empty_output(input_ids, shape);
  Tensor lab = empty_output(label_src, shape);
  Tensor positions = empty_output(input_ids, shape, ScalarType::Long);
  Tensor seq_idx = empty_output(input_ids, shape, ScalarType::Int);
  Tensor cu = torch::stable::new_empty(input_ids, {num_cu_seqlens}, ScalarType::Int);
  Tensor cu_seg = torch::stable::new_empty(input_ids, {num_cu_seqlens - 1}, ScalarType::Int);
  pack_batch_out_cpu(input_ids, labels, src_offsets, seg_seq, seg_start, seg_length, bin_offsets, flat, ids, lab,
                     positions, seq_idx, cu, cu_seg, pad_id, ignore_index, mask_first_label, position_start);
  return {ids, lab, positions, seq_idx, cu};
}

Tensor unpack_cpu(const Tensor& packed, const Tensor& src_offsets, const Tensor& seg_seq, const Tensor& seg_start,
                  const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, int64_t num_src_tokens,
                  double pad_value) {
  check_index_tensor(src_offsets, "unpack", "src_offsets", ScalarType::Long);
  check_segment_args(packed, seg_seq, seg_start, cu_seqlens, cu_seg, "unpack");
  packed_tokens(packed, flat, "unpack");
  STD_TORCH_CHECK(num_src_tokens >= 0, "packkit::unpack: num_src_tokens must be >= 0");
  STD_TORCH_CHECK(packed.is_cpu(), "packkit::unpack: packed must be a CPU tensor here");
  Tensor out = empty_output(packed, unpacked_shape(packed, {num_src_tokens}, flat));
  unpack_impl("unpack", packed, src_offsets, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out);
  return out;
}

Tensor unpack_padded_cpu(const Tensor& packed, const Tensor& seg_seq, const Tensor& seg_start,
                         const Tensor& cu_seqlens, const Tensor& cu_seg, bool flat, int64_t num_sequences,
                         int64_t max_len, double pad_value) {
  check_segment_args(packed, seg_seq, seg_start, cu_seqlens, cu_seg, "unpack_padded");
  packed_tokens(packed, flat, "unpack_padded");
  STD_TORCH_CHECK(num_sequences >= 0 && max_len >= 0, "packkit::unpack_padded: num_sequences and max_len must be >= 0");
  STD_TORCH_CHECK(packed.is_cpu(), "packkit::unpack_padded: packed must be a CPU tensor here");
  Tensor out = empty_output(packed, unpacked_shape(packed, {num_sequences, max_len}, flat));
  unpack_padded_impl("unpack_padded", packed, seg_seq, seg_start, cu_seqlens, cu_seg, flat, pad_value, out);
  return out;
}

}  // namespace packkit::ops
