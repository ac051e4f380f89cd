// AVX2 + FMA + F16C kernels over GGUF blocks, compiled with target attributes so that one library runs on any
// x86-64 CPU (gemm.cpp dispatches on what the CPU reports at run time).
//
// Two shapes of work:
// - dot_row_m1: one activation row (decode, M = 1). Each block's 32 weights stay integers (int16 lanes) and
//   meet the activations split into two int16 limbs in exact integer dot products; the block scale multiplies
//   the block's dot once (d * sum q x), the offset uses the activations' block sums (m * sum x), so no weight
//   is ever materialised or converted to float one by one.
// - dequant_rows + tile: M >= 2. A panel of weight rows is decoded once into a float32 buffer that stays in
//   L1/L2 and is reused by every row tile of x (MR rows x NR weight rows of 8-lane accumulators).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cmath>

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

// The activations of one decode row as two int16 limbs per block: x = s_b (h + l / 2^15), s_b the power of two
// with max |x_b| <= 16383 s_b, so x / s_b and the residual x - s_b h are exact and only l is rounded: the split
// is exact to s_b 2^-16 <= max |x_b| 2^-29. The weights' integers then meet x in exact int32 dot products
// (_mm256_madd_epi16), which cost fewer instructions per weight than converting every weight to float.
struct SplitX {
  int16_t* h;   // [K]
  int16_t* l;   // [K]
  float* s;     // [K / 32]
  float* sum;   // [K / 32]: sum of x over the block (for the offsets m)
};

// 8 floats, already integers in [-32768, 32767], as int16 into out[0..7].
PQ_AVX2 inline void store_int16(__m256 v, int16_t* out) {
  const __m256i i = _mm256_cvtps_epi32(v);
  const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
}

// Returns false (and the caller takes the float path) when x holds an inf or a NaN (the float path propagates
// them) or a block whose largest |x| is below 2^-60 but not 0 (its scale would leave float's normal range).
PQ_AVX2 inline bool split_x(const float* x, int64_t K, SplitX sx) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  constexpr int NEAREST = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t b = 0; b < K / 32; b++) {
    const float* xb = x + 32 * b;
    __m256 v[4], mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], abs_mask));
      sum = _mm256_add_ps(sum, v[i]);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mx);
    float m = 0.0f;
    for (float f : lanes) m = std::fmax(m, f);
    const float total = hsum(sum);
    if (!std::isfinite(total) || !std::isfinite(m) || (m > 0.0f && m < 0x1p-60f)) return false;
    const float s = m > 0.0f ? std::ldexp(1.0f, std::ilogb(m / 16383.0f) + 1) : 1.0f;  // 2^e >= max / 16383
    const __m256 vs = _mm256_set1_ps(s), two15 = _mm256_set1_ps(32768.0f);
    for (int i = 0; i < 4; i++) {
      const __m256 h = _mm256_round_ps(_mm256_div_ps(v[i], vs), NEAREST);  // x / s is exact, then rounded
      const __m256 r = _mm256_sub_ps(v[i], _mm256_mul_ps(h, vs));          // x - s h, exact
      store_int16(h, sx.h + 32 * b + 8 * i);
      store_int16(_mm256_round_ps(_mm256_mul_ps(_mm256_div_ps(r, vs), two15), NEAREST), sx.l + 32 * b + 8 * i);
    }
    sx.s[b] = s;
    sx.sum[b] = total;
  }
  return true;
}

// The 32 integers of block b as int16: q[0] = weights 0..15, q[1] = 16..31 (Q4: nibbles 0..15, Q8_0: int8).
template <int64_t T>
PQ_AVX2 inline void int16s(const uint8_t* blk, __m256i q[2], float* d, float* m) {
  *d = half_at(blk);
  if constexpr (T == Q8_0) {
    q[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    q[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
    *m = 0.0f;
  } else {
    const int off = T == Q4_0 ? 2 : 4;
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + off)));
    q[0] = _mm256_and_si256(v, _mm256_set1_epi16(0xf));
    q[1] = _mm256_srli_epi16(v, 4);
    *m = T == Q4_0 ? -8.0f * *d : half_at(blk + 2);  // (q - 8) d = q d - 8 d
  }
}

// d s (H + L / 2^15) of block b into acc, m sum x into *off: H = sum q h and L = sum q l are exact int32 sums
// (|H|, |L| < 2^24, so both convert to float exactly) and d s is exact (s is a power of two).
template <int64_t T>
PQ_AVX2 inline void block_dot(const uint8_t* blk, const SplitX& sx, int64_t b, __m256* acc, float* off) {
  __m256i q[2];
  float d, m;
  int16s<T>(blk, q, &d, &m);
  const __m256i* h = reinterpret_cast<const __m256i*>(sx.h + 32 * b);
  const __m256i* l = reinterpret_cast<const __m256i*>(sx.l + 32 * b);
  const __m256i H = _mm256_add_epi32(_mm256_madd_epi16(q[0], _mm256_loadu_si256(h)),
                                     _mm256_madd_epi16(q[1], _mm256_loadu_si256(h + 1)));
  const __m256i L = _mm256_add_epi32(_mm256_madd_epi16(q[0], _mm256_loadu_si256(l)),
                                     _mm256_madd_epi16(q[1], _mm256_loadu_si256(l + 1)));
  const __m256 p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L), _mm256_set1_ps(1.0f / 32768.0f), _mm256_cvtepi32_ps(H));
  *acc = _mm256_fmadd_ps(p, _mm256_set1_ps(d * sx.s[b]), *acc);
  if constexpr (T != Q8_0) *off += m * sx.sum[b];
}

// sum_k w[k] x[k] for one weight row of nb blocks against the split activations; even and odd blocks in
// separate chains, so the accumulator's FMA latency is paid once per two blocks.
template <int64_t T>
PQ_AVX2 inline float dot_row_m1(const uint8_t* row, const SplitX& sx, int64_t nb) {
  constexpr int BYTES = layout_of(T).bytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float off0 = 0.0f, off1 = 0.0f;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block_dot<T>(row + b * BYTES, sx, b, &acc0, &off0);
    block_dot<T>(row + (b + 1) * BYTES, sx, b + 1, &acc1, &off1);
  }
  if (b < nb) block_dot<T>(row + b * BYTES, sx, b, &acc0, &off0);
  return hsum(_mm256_add_ps(acc0, acc1)) + (off0 + off1);
}

// Rows [n0, n0 + rows) of a weight of type T (row_bytes each) decoded into y[rows][K]: w = q d + m.
template <int64_t T>
PQ_AVX2 inline void dequant_rows_t(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y) {
  constexpr int BYTES = layout_of(T).bytes;
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
