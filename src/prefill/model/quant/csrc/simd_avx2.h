// AVX2 + FMA + F16C kernels over GGUF blocks, compiled with target attributes so that one library runs on any
// x86-64 CPU (gemm.cpp dispatches on what the CPU reports at run time).
//
// Two shapes of work:
// - dot_row_m1: one activation row (decode, M = 1). Each block's 32 weights stay integers-as-floats in four
//   registers; the block scale multiplies the block's partial dot once (d * sum q x), and the offset uses the
//   activations' block sums (m * sum x), so no weight is ever materialised.
// - dequant_rows + tile: M >= 2. A panel of weight rows is decoded once into a float32 buffer that stays in
//   L1/L2 and is reused by every row tile of x (MR rows x NR weight rows of 8-lane accumulators).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "blocks.h"

#define PQ_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace prefill_quant::avx2 {

PQ_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

PQ_AVX2 inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 32 nibbles of a Q4 block as floats: q[0] = weights 0..7, q[1] = 8..15, q[2] = 16..23, q[3] = 24..31.
PQ_AVX2 inline void nibbles(const uint8_t* qs, __m256 q[4]) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i lo = _mm256_cvtepu8_epi32(v);                     // bytes 0..7, both nibbles
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v));  // bytes 8..15
  const __m256i mask = _mm256_set1_epi32(0xf);
  q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, mask));
  q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, mask));
  q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));
  q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));
}

PQ_AVX2 inline void int8s(const uint8_t* qs, __m256 q[4]) {
  for (int i = 0; i < 4; i++)
    q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i))));
}

// Scale d, offset m (w = q d + m) and integer values q[4] of block b of a row of type T.
template <int64_t T>
PQ_AVX2 inline void decode(const uint8_t* blk, __m256 q[4], float* d, float* m) {
  *d = half_at(blk);
  if constexpr (T == Q4_0) {
    nibbles(blk + 2, q);
    *m = -8.0f * *d;  // (q - 8) d = q d - 8 d, both products exact in float32
  } else if constexpr (T == Q4_1) {
    nibbles(blk + 4, q);
    *m = half_at(blk + 2);
  } else {
    int8s(blk + 2, q);
    *m = 0.0f;
  }
}

// sum_k w[k] x[k] for one weight row of nb blocks; xsum[b] = sum of x over block b (for the offsets).
template <int64_t T>
PQ_AVX2 inline float dot_row_m1(const uint8_t* row, const float* x, const float* xsum, int64_t nb) {
  constexpr int BYTES = T == Q4_0 ? 18 : T == Q4_1 ? 20 : 34;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float offsets = 0.0f;
  for (int64_t b = 0; b < nb; b++) {
    __m256 q[4];
    float d, m;
    decode<T>(row + b * BYTES, q, &d, &m);
    const float* xb = x + 32 * b;
    __m256 p = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
    p = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), p);
    __m256 p2 = _mm256_mul_ps(q[2], _mm256_loadu_ps(xb + 16));
    p2 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), p2);
    const __m256 vd = _mm256_set1_ps(d);
    acc0 = _mm256_fmadd_ps(p, vd, acc0);
    acc1 = _mm256_fmadd_ps(p2, vd, acc1);
    if constexpr (T != Q8_0) offsets += m * xsum[b];
  }
  return hsum(_mm256_add_ps(acc0, acc1)) + offsets;
}

// Rows [n0, n0 + rows) of a weight of type T (row_bytes each) decoded into y[rows][K]: w = q d + m.
template <int64_t T>
PQ_AVX2 inline void dequant_rows_t(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y) {
  constexpr int BYTES = T == Q4_0 ? 18 : T == Q4_1 ? 20 : 34;
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    float* yr = y + r * K;
    for (int64_t b = 0; b < K / 32; b++) {
      __m256 q[4];
      float d, m;
      decode<T>(row + b * BYTES, q, &d, &m);
      const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
      for (int i = 0; i < 4; i++) _mm256_storeu_ps(yr + 32 * b + 8 * i, _mm256_fmadd_ps(q[i], vd, vm));
    }
  }
}

// out[m][n] = sum_k x[m][k] w[n][k] for an MR x NR tile; K a multiple of 8 (every GGUF block is).
template <int MR, int NR>
PQ_AVX2 inline void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* out, int64_t ldo) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; j++) wv[j] = _mm256_loadu_ps(w + j * ldw + k);
    for (int i = 0; i < MR; i++) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
      for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) out[i * ldo + j] = hsum(acc[i][j]);
}

}  // namespace prefill_quant::avx2
#endif
