// Host-side arithmetic of the CUDA launches: grid sizes a device accepts and the memory word the gathers may use.
// Plain C++ (no CUDA, no torch), so tests/test_launch_sizes.py compiles it with g++ and checks it at the largest
// sizes the ops accept; the .cu files turn a refusal into an error naming the op.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace packkit::ops::launch {

constexpr int64_t kMaxGridX = 2147483647;  // 2^31 - 1 blocks (grid.y / grid.z: 65,535; no launch here uses them)
constexpr int64_t kMaxGridYZ = 65535;

// Blocks of a grid whose every block owns `per_block` consecutive items: ceil(work / per_block), 0 for no work,
// or -1 when a device would refuse the grid (more than 2^31 - 1 blocks). Written without work + per_block - 1,
// which could overflow.
constexpr int64_t tiles(int64_t work, int64_t per_block) {
  if (work <= 0 || per_block <= 0) return 0;
  const int64_t blocks = work / per_block + (work % per_block != 0 ? 1 : 0);
  return blocks <= kMaxGridX ? blocks : -1;
}

// Blocks of a grid-stride loop over `work` items with `threads` per block: ceil(work / threads), at most `cap`
// (the loop covers the rest), so never past a device's limit.
constexpr int64_t strided(int64_t work, int64_t threads, int64_t cap) {
  if (work <= 0 || threads <= 0) return 0;
  const int64_t blocks = work / threads + (work % threads != 0 ? 1 : 0);
  return blocks < cap ? blocks : cap;
}

// The widest word (a power of two dividing elem_size, at most elem_size) at which every address is aligned.
// The gathers copy an element as one elem_size word (up to 16 bytes: ulonglong2), which faults on an address
// that is not a multiple of its size; torch's allocator aligns, but external memory (DLPack, a byte-offset
// view) need not, so such a tensor is copied in narrower words.
inline int64_t aligned_word(int64_t elem_size, std::initializer_list<const void*> addresses) {
  uintptr_t bits = 0;
  for (const void* p : addresses) bits |= reinterpret_cast<uintptr_t>(p);
  int64_t word = 1;
  while (word < elem_size && word < 16 && elem_size % (word * 2) == 0 && bits % (word * 2) == 0) word *= 2;
  return word;
}

}  // namespace packkit::ops::launch
