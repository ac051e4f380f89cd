// 8-bit activations on GGUF blocks (llama.cpp's Q8_0 / Q8_1 idea): each activation row is quantised per 32-block
// to int8 with a float scale, and the weights' integers meet it in exact integer dot products.
//
//   x_b ~ d_b q,  d_b = max |x_b| / 127,  q = round(x / d_b) (to nearest even, |q| <= 127)
//
// The block sums (sum q, and d_b sum q rounded once: Q8_1's s) carry the weights' offsets: Q4_0's -8 (w = (q_w - 8)
// d_w) in integers, Q4_1's m (w = q_w d_w + m) as m s. Every kernel (scalar here, AVX2 in q8_avx2.h, AVX-512 VNNI
// in q8_avx512.h) computes each output in the same order, so all of them give the same float32 bits:
//
//   acc = 0;  for each block b:  I = sum_k q_w q_x (int32, exact; Q4_0: - 8 sum q_x)
//                                p = (d_w d_b) I;  Q4_1: p = p + m s_b;  acc = acc + p
//
// The quantiser is this one scalar function for every kernel (the SIMD kernels read its int8s in another order).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "blocks.h"
#include "packed.h"

namespace prefill_quant::q8 {

constexpr int64_t QK = 32;  // activations per block (every type with an 8-bit path has 32-weight blocks)

constexpr int64_t TILE = 8;  // activation rows the SIMD kernels take at once

// M rows of activations, quantised: row-major for the scalar kernel, and the same values again in tiles of
// TILE rows for the SIMD kernels, [M / TILE][nb][TILE] (the last tile padded with zeros): a block's rows sit
// at constant offsets from one pointer. In the tiles the int8s of a block are in the order of the weight units
// the kernels read (Q4: unit j = x[2j], x[2j+1], x[2j+16], x[2j+17]; Q8_0: natural).
struct QRows {
  const int8_t* q;     // [M, K]
  const float* d;      // [M, nb]: the blocks' scales d_b
  const int32_t* sum;  // [M, nb]: sum of q over the block
  const float* s;      // [M, nb]: d_b * sum, rounded once
  const int8_t* tq;    // [tiles, nb, TILE, 32]
  const float* td;     // [tiles, nb, TILE], and so on
  const int32_t* tsum;
  const float* ts;
  int64_t K, nb;
  int64_t at(int64_t tile, int64_t b) const { return (tile * nb + b) * TILE; }  // index of a tile's block
};

// One row x[K] into q[K], d, sum, s [K / 32]. False when a block holds an inf or a NaN, or a largest |x| in
// (0, 2^-100) (its scale would leave float's normal range): the float32 path then runs the product.
inline bool quantize_row(const float* x, int64_t K, int8_t* q, float* d, int32_t* sum, float* s) {
  for (int64_t b = 0; b < K / QK; b++) {
    const float* xb = x + b * QK;
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) {
      const float a = std::fabs(xb[i]);
      if (!(a <= FLT_MAX)) return false;
      amax = a > amax ? a : amax;
    }
    if (amax > 0.0f && amax < 0x1p-100f) return false;
    const float db = amax / 127.0f;
    const float id = db > 0.0f ? 1.0f / db : 0.0f;
    int32_t total = 0;
    for (int i = 0; i < QK; i++) {
      // x id to the nearest integer, ties to even (|x id| <= 127.01 < 2^22: adding 1.5 * 2^23 rounds it as
      // IEEE does, exactly nearbyint; a libm call per element cost more than the product at M = 8)
      float v = (xb[i] * id + 0x1.8p23f) - 0x1.8p23f;
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
      q[b * QK + i] = (int8_t)v;
      total += (int32_t)v;
    }
    d[b] = db;
    sum[b] = total;
    s[b] = db * (float)total;
  }
  return true;
}

// Row m (quantised, natural order: q[K], d, sum, s [nb]) into its place in the tiles, Q4 blocks in unit order.
inline void to_tiles(const QRows& x, int64_t m, bool q4, int8_t* tq, float* td, int32_t* tsum, float* ts) {
  const int8_t* q = x.q + m * x.K;
  for (int64_t b = 0; b < x.nb; b++) {
    const int64_t i = x.at(m / TILE, b) + m % TILE;
    int8_t* u = tq + i * QK;
    const int8_t* qb = q + b * QK;
    for (int j = 0; j < 8 && q4; j++) {
      u[4 * j] = qb[2 * j];
      u[4 * j + 1] = qb[2 * j + 1];
      u[4 * j + 2] = qb[2 * j + 16];
      u[4 * j + 3] = qb[2 * j + 17];
    }
    if (!q4) std::memcpy(u, qb, QK);
    td[i] = x.d[m * x.nb + b];
    tsum[i] = x.sum[m * x.nb + b];
    ts[i] = x.s[m * x.nb + b];
  }
}

// One plain row of nb blocks of type T against quantised row m of x (the portable kernel; the order above).
template <int64_t T>
inline float dot_row(const uint8_t* row, const QRows& x, int64_t m) {
  constexpr int BYTES = layout_of(T).bytes;
  const int8_t* q = x.q + m * x.K;
  const float* d = x.d + m * x.nb;
  float acc = 0.0f;
  for (int64_t b = 0; b < x.nb; b++) {
    const uint8_t* blk = row + b * BYTES;
    const int8_t* qb = q + b * QK;
    int32_t I = 0;
    if constexpr (T == Q8_0) {
      const int8_t* w = reinterpret_cast<const int8_t*>(blk + 2);
      for (int i = 0; i < 32; i++) I += (int32_t)w[i] * qb[i];
    } else {
      const uint8_t* n = blk + (T == Q4_0 ? 2 : 4);
      for (int i = 0; i < 16; i++) I += (int32_t)(n[i] & 0xf) * qb[i] + (int32_t)(n[i] >> 4) * qb[i + 16];
      if constexpr (T == Q4_0) I -= 8 * x.sum[m * x.nb + b];
    }
    float p = (half_at(blk) * d[b]) * (float)I;
    if constexpr (T == Q4_1) p = p + half_at(blk + 2) * x.s[m * x.nb + b];
    acc = acc + p;
  }
  return acc;
}

template <int64_t T>
inline void rows_scalar(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QRows& x, int64_t m0,
                        int64_t m1, float* out, int64_t ldo) {
  for (int64_t n = n0; n < n1; n++)
    for (int64_t m = m0; m < m1; m++) out[m * ldo + n] = dot_row<T>(w + n * row_bytes, x, m);
}

}  // namespace prefill_quant::q8
