// The x8 layout: the same GGUF blocks, eight rows interleaved, so one 8-lane register holds one value of each
// of eight weight rows and a product needs no horizontal sum (ggml's repacked Q4_0x8 follows the same idea).
//
// Every block of Q4_0, Q4_1 and Q8_0 is a sequence of 2-byte units (Q4_1: d, m, then 8 units of nibbles; Q4_0:
// d, 8 units; Q8_0: d, 16 units of int8). Rows 8g .. 8g + 7 of a matrix form group g, stored where the eight
// rows were (8 row_bytes bytes); block column b of the group is a segment of 8 blocks' bytes in which unit u of
// row r sits at (8 u + r) * 2. So a segment starts with the eight rows' scales d (one 16-byte load, eight
// halves), then their offsets m (Q4_1), then unit after unit of the eight rows' weights. The N % 8 last rows
// keep the plain layout. Packing only moves bytes: a packed matrix has exactly the blocks' bytes.
//
// A packed matrix's type is the GGUF type | PACKED (gemm.h), so every operator taking (w, type) reads both; the
// ACT_Q8 bit chooses 8-bit activations for the products (q8.cpp), and the other operators ignore it.
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.h"

namespace prefill_quant {

constexpr int64_t PACKED = 0x100;  // type bit: the matrix is in the x8 layout
constexpr int64_t GROUP = 8;       // rows per group
constexpr int64_t ACT_Q8 = 0x200;  // type bit: multiply with 8-bit activations (q8.h) where the type has them
constexpr int64_t TYPE_MASK = 0xff;  // the GGUF type without the bits

// The types the integer kernels read (the x8 layout, and the plain layout's direct M = 1 dot).
inline bool packable(int64_t t) { return t == Q4_0 || t == Q4_1 || t == Q8_0; }

// Group g of rows (row_bytes each, nb blocks of `bytes`) from the plain layout into the x8 layout, or back.
inline void pack_group(const uint8_t* plain, int64_t row_bytes, int bytes, uint8_t* packed) {
  const int64_t nb = row_bytes / bytes, units = bytes / 2;
  for (int64_t b = 0; b < nb; b++) {
    uint8_t* seg = packed + b * GROUP * bytes;
    for (int64_t r = 0; r < GROUP; r++) {
      const uint8_t* blk = plain + r * row_bytes + b * bytes;
      for (int64_t u = 0; u < units; u++) std::memcpy(seg + (u * GROUP + r) * 2, blk + 2 * u, 2);
    }
  }
}

inline void unpack_group(const uint8_t* packed, int64_t row_bytes, int bytes, uint8_t* plain) {
  const int64_t nb = row_bytes / bytes, units = bytes / 2;
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* seg = packed + b * GROUP * bytes;
    for (int64_t r = 0; r < GROUP; r++) {
      uint8_t* blk = plain + r * row_bytes + b * bytes;
      for (int64_t u = 0; u < units; u++) std::memcpy(blk + 2 * u, seg + (u * GROUP + r) * 2, 2);
    }
  }
}

// Rows [n0, n1) of a matrix (plain or packed, type t without the PACKED bit) as plain blocks into out
// [(n1 - n0) * row_bytes]; n0 a multiple of GROUP when packed. The portable path decodes from these.
inline void plain_rows(const uint8_t* w, bool packed, int64_t t, int64_t N, int64_t row_bytes, int64_t n0,
                       int64_t n1, uint8_t* out) {
  const int bytes = layout_of(t).bytes;
  const int64_t full = packed ? N / GROUP * GROUP : 0;  // rows in whole groups (the rest are plain)
  int64_t n = n0;
  for (; n < n1 && n < full; n += GROUP)
    unpack_group(w + n * row_bytes, row_bytes, bytes, out + (n - n0) * row_bytes);
  if (n < n1) std::memcpy(out + (n - n0) * row_bytes, w + n * row_bytes, (n1 - n) * row_bytes);
}

}  // namespace prefill_quant
