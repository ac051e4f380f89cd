// The SIMD kernels of the types read in the plain layout (no x8 kernel): the K-quants Q4_K and Q6_K (blocks of
// 256 weights whose sub-blocks carry their own scales) and Q5_0 / Q5_1 (Q4's blocks of 32 with a fifth bit a
// weight); blocks.h has the layouts and the scalar decoding these must agree with.
//
// - rows_avx2 / rows_avx512: R <= 4 activation rows (decode, a few rows of a batch) against one weight row,
//   straight from the blocks, on the arithmetic of simd_avx2.h's M = 1 dot: each 32-block of x split into two
//   int16 limbs over a power-of-two scale s, the weights' small integers met in exact int32 dot products
//   (AVX2: _mm256_madd_epi16; AVX-512: VNNI's _mm512_dpwssd_epi32, 32 weights an instruction), each sub-block's
//   sum scaled once in float. Q4_K's sub-block of 32 (6-bit scale sc, 6-bit min m): d sc sum q x - dmin m sum x.
//   Q6_K's sub-blocks of 16 (int8 scale): d sc sum (q - 32) x, the two 16-halves of a 32-block in separate
//   lanes (an AVX-512 lane sums 2 products, an AVX2 lane 2, within one half), so no integer leaves 2^24 and
//   every conversion to float is exact: only the float accumulation rounds. Q5_0: d sum (q - 16) x; Q5_1:
//   d sum q x + m sum x.
// - dequant_rows_avx2: rows decoded into float32 for the panel kernel (M >= 5), bit for bit the scalar decoder's
//   (d sc q is exact in float32; Q4_K's one rounding, d sc q - dmin m, is the same with or without FMA).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstring>

#include "blocks.h"
#include "simd_avx2.h"

#define PQ_K512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace prefill_quant::kq {

using avx2::SplitX;

inline bool kquant(int64_t t) { return t == Q4_K || t == Q6_K || t == Q5_0 || t == Q5_1; }

// A Q4_K block's 12 bytes of packed 6-bit values as bytes: out[0..7] the scales, out[8..15] the mins (what
// blocks.h's scale_min_k4 gives for j = 0..7, four at a time in 32-bit words; x86 is little-endian).
inline void q4k_scales(const uint8_t* s, uint8_t out[16]) {
  constexpr uint32_t LOW6 = 0x3f3f3f3f, LOW4 = 0x0f0f0f0f, TOP2 = 0x03030303;
  uint32_t u[3], v[4];
  std::memcpy(u, s, 12);
  v[0] = u[0] & LOW6;                                       // scales 0..3: bytes 0..3, low 6 bits
  v[1] = (u[2] & LOW4) | (((u[0] >> 6) & TOP2) << 4);       // scales 4..7: bytes 8..11 low, bytes 0..3 top
  v[2] = u[1] & LOW6;                                       // mins 0..3: bytes 4..7, low 6 bits
  v[3] = ((u[2] >> 4) & LOW4) | (((u[1] >> 6) & TOP2) << 4);  // mins 4..7: bytes 8..11 high, bytes 4..7 top
  std::memcpy(out, v, 16);
}

// Bits shift, shift + 1 of each byte of hi, moved to bits 4, 5 (16-bit shifts, masked to the byte).
PQ_AVX2 inline __m256i top2(__m256i hi, int shift) {
  const __m256i m2 = _mm256_set1_epi8(3);
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(shift)), m2), 4);
}

// Q6_K's 6-bit values of one half (128 weights: 64 bytes ql, 32 bytes qh) as 4 x 32 bytes 0..63, in weight
// order: q[i] holds weights 32 i .. 32 i + 31 of the half.
PQ_AVX2 inline void q6k_half(const uint8_t* ql, const uint8_t* qh, __m256i q[4]) {
  const __m256i lo0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i lo1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  q[0] = _mm256_or_si256(_mm256_and_si256(lo0, m4), top2(hi, 0));
  q[1] = _mm256_or_si256(_mm256_and_si256(lo1, m4), top2(hi, 2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m4), top2(hi, 4));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4), top2(hi, 6));
}

// Per sub-block scale times each row's split scale: ds[r][j] = d sc_j s_r(block of j), exact (d sc has at most
// 17 significant bits, s is a power of two). `per` sub-blocks share one 32-block of x (Q4_K 1, Q6_K 2).
template <int R, int J>
PQ_AVX2 inline void row_scales(const float* dsc, const SplitX* sx, int64_t first, int per, float ds[R][J]) {
  for (int r = 0; r < R; r++)
    for (int j = 0; j < J; j++) ds[r][j] = dsc[j] * sx[r].s[first + j / per];
}

// ---- AVX2 ----------------------------------------------------------------------------------------------------

// sum q (s h + s l 2^-15) over 16 + 16 int16 weights of one 32-block of x: H, L exact int32 (|H| <= 2 * 63 *
// 16383 a lane), converted exactly; returns the 8 lanes of p = H + L 2^-15 (one rounding each) for q[0] and q[1].
PQ_AVX2 inline __m256 limb_dot(__m256i q, const int16_t* h, const int16_t* l) {
  const __m256i H = _mm256_madd_epi16(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  const __m256i L = _mm256_madd_epi16(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l)));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(L), _mm256_set1_ps(1.0f / 32768.0f), _mm256_cvtepi32_ps(H));
}

// A Q4_K block's per-row scales ds[r][j] = d sc_j s_r (row_scales) and its mins' part of each row's offset,
// dmin m_j sum_j x, added to off[r] (both products exact).
template <int R>
PQ_AVX2 inline void q4k_scales_rows(const uint8_t* blk, const SplitX* sx, int64_t b, float ds[R][8], __m256 off[R]) {
  alignas(16) uint8_t sm[16];
  q4k_scales(blk + 4, sm);
  const __m128i sm8 = _mm_load_si128(reinterpret_cast<const __m128i*>(sm));
  const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm8));
  const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm8, sm8)));
  alignas(32) float dsc[8];
  _mm256_store_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(avx2::half_at(blk)), sc));
  const __m256 dmn = _mm256_mul_ps(_mm256_set1_ps(avx2::half_at(blk + 2)), mn);
  row_scales<R, 8>(dsc, sx, 8 * b, 1, ds);
  for (int r = 0; r < R; r++) off[r] = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(sx[r].sum + 8 * b), off[r]);
}

template <int R>
PQ_AVX2 inline void q4k_block_avx2(const uint8_t* blk, const SplitX* sx, int64_t b, __m256 acc[2][R],
                                   __m256 off[R]) {
  alignas(32) float ds[R][8];
  q4k_scales_rows<R>(blk, sx, b, ds, off);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int g = 0; g < 4; g++) {  // 32 bytes: sub-block 2g in the low nibbles, 2g + 1 in the high
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g));
    const __m256i nib[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
    for (int half = 0; half < 2; half++) {
      const int j = 2 * g + half;
      const __m256i q0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(nib[half]));
      const __m256i q1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(nib[half], 1));
      for (int r = 0; r < R; r++) {
        const int16_t *h = sx[r].h + 32 * (8 * b + j), *l = sx[r].l + 32 * (8 * b + j);
        const __m256 p = _mm256_add_ps(limb_dot(q0, h, l), limb_dot(q1, h + 16, l + 16));
        acc[half][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(ds[r][j]), acc[half][r]);
      }
    }
  }
}

template <int R>
PQ_AVX2 inline void q6k_block_avx2(const uint8_t* blk, const SplitX* sx, int64_t b, __m256 acc[2][R]) {
  alignas(32) float dsc[16], ds[R][16];
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
  const __m256 d = _mm256_set1_ps(avx2::half_at(blk + 208));
  _mm256_store_ps(dsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
  _mm256_store_ps(dsc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc)))));
  row_scales<R, 16>(dsc, sx, 8 * b, 2, ds);
  const __m256i k32 = _mm256_set1_epi16(32);
  for (int half = 0; half < 2; half++) {
    __m256i q[4];
    q6k_half(blk + 64 * half, blk + 128 + 32 * half, q);
    for (int i = 0; i < 4; i++) {
      const int t = 4 * half + i;  // the 32-block within the block; its 16-halves take scales 2t and 2t + 1
      const __m256i q0 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q[i])), k32);
      const __m256i q1 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(q[i], 1)), k32);
      for (int r = 0; r < R; r++) {
        const int16_t *h = sx[r].h + 32 * (8 * b + t), *l = sx[r].l + 32 * (8 * b + t);
        acc[0][r] = _mm256_fmadd_ps(limb_dot(q0, h, l), _mm256_set1_ps(ds[r][2 * t]), acc[0][r]);
        acc[1][r] = _mm256_fmadd_ps(limb_dot(q1, h + 16, l + 16), _mm256_set1_ps(ds[r][2 * t + 1]), acc[1][r]);
      }
    }
  }
}

// A Q5 block's 32 weights as int16 (Q5_0: q - 16; Q5_1: q): q[0] weights 0..15, q[1] 16..31. The fifth bits:
// each lane tests its own bit of the word, and where set adds 16.
template <int64_t T>
PQ_AVX2 inline void q5_int16(const uint8_t* blk, __m256i q[2]) {
  constexpr int OFF = T == Q5_1 ? 4 : 2;
  uint32_t qh;
  std::memcpy(&qh, blk + OFF, 4);
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + OFF + 4)));
  const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                        (int16_t)0x8000);
  const __m256i k16 = _mm256_set1_epi16(16);
  const __m256i lo = _mm256_and_si256(_mm256_set1_epi16((int16_t)(qh & 0xffff)), bit);
  const __m256i hi = _mm256_and_si256(_mm256_set1_epi16((int16_t)(qh >> 16)), bit);
  q[0] = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0xf)), _mm256_and_si256(_mm256_cmpeq_epi16(lo, bit), k16));
  q[1] = _mm256_or_si256(_mm256_srli_epi16(v, 4), _mm256_and_si256(_mm256_cmpeq_epi16(hi, bit), k16));
  if constexpr (T == Q5_0) q[0] = _mm256_sub_epi16(q[0], k16), q[1] = _mm256_sub_epi16(q[1], k16);
}

// One Q5 block b (the split's 32-block b) into acc; Q5_1's m sum x into offs (added: w = q d + m).
template <int64_t T, int R>
PQ_AVX2 inline void q5_block_avx2(const uint8_t* blk, const SplitX* sx, int64_t b, __m256 acc[2][R], float offs[R]) {
  __m256i q[2];
  q5_int16<T>(blk, q);
  const float d = avx2::half_at(blk);
  for (int r = 0; r < R; r++) {
    const int16_t *h = sx[r].h + 32 * b, *l = sx[r].l + 32 * b;
    const __m256 ds = _mm256_set1_ps(d * sx[r].s[b]);
    acc[0][r] = _mm256_fmadd_ps(limb_dot(q[0], h, l), ds, acc[0][r]);
    acc[1][r] = _mm256_fmadd_ps(limb_dot(q[1], h + 16, l + 16), ds, acc[1][r]);
    if constexpr (T == Q5_1) offs[r] += avx2::half_at(blk + 2) * sx[r].sum[b];
  }
}

// out[r * ldo] = sum_k w[k] x_r[k] for one weight row of nb blocks of type T and R split rows of x.
template <int64_t T, int R>
PQ_AVX2 inline void rows_avx2(const uint8_t* row, const SplitX* sx, int64_t nb, float* out, int64_t ldo) {
  constexpr int BYTES = layout_of(T).bytes;
  __m256 acc[2][R], off[R];
  float offs[R] = {};
  for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = off[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    if constexpr (T == Q4_K) q4k_block_avx2<R>(row + b * BYTES, sx, b, acc, off);
    else if constexpr (T == Q6_K) q6k_block_avx2<R>(row + b * BYTES, sx, b, acc);
    else q5_block_avx2<T, R>(row + b * BYTES, sx, b, acc, offs);
  }
  for (int r = 0; r < R; r++)
    out[r * ldo] = avx2::hsum(_mm256_add_ps(acc[0][r], acc[1][r])) - avx2::hsum(off[r]) + offs[r];
}

// Rows of a Q5 matrix decoded into y[rows][K], as blocks.h decodes them (q d exact; Q5_1's + m one rounding).
template <int64_t T>
PQ_AVX2 inline void dequant_rows_q5_avx2(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y) {
  constexpr int BYTES = layout_of(T).bytes;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < K / 32; b++) {
      const uint8_t* blk = w + r * row_bytes + b * BYTES;
      __m256i q[2];
      q5_int16<T>(blk, q);
      const __m256 d = _mm256_set1_ps(avx2::half_at(blk)), m = _mm256_set1_ps(T == Q5_1 ? avx2::half_at(blk + 2) : 0.0f);
      for (int i = 0; i < 4; i++) {
        const __m128i eight = i % 2 ? _mm256_extracti128_si256(q[i / 2], 1) : _mm256_castsi256_si128(q[i / 2]);
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(eight));
        _mm256_storeu_ps(y + r * K + 32 * b + 8 * i, T == Q5_1 ? _mm256_fmadd_ps(v, d, m) : _mm256_mul_ps(v, d));
      }
    }
}

// Rows of a Q4_K or Q6_K matrix decoded into y[rows][K], as blocks.h decodes them.
template <int64_t T>
PQ_AVX2 inline void dequant_rows_avx2(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y) {
  constexpr int BYTES = layout_of(T).bytes;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < K / 256; b++) {
      const uint8_t* blk = w + r * row_bytes + b * BYTES;
      float* yb = y + r * K + 256 * b;
      __m256i q[8];  // 8 x 32 values of the block (as bytes), in weight order
      float scale[16], minus[8] = {};  // sub-block scales (Q4_K: 8 of 32 weights; Q6_K: 16 of 16), Q4_K's d m
      int per;  // weights per scale
      if constexpr (T == Q4_K) {
        uint8_t sm[16];
        q4k_scales(blk + 4, sm);
        const float d = avx2::half_at(blk), dmin = avx2::half_at(blk + 2);
        for (int j = 0; j < 8; j++) scale[j] = d * (float)sm[j], minus[j] = dmin * (float)sm[8 + j];
        for (int g = 0; g < 4; g++) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g));
          q[2 * g] = _mm256_and_si256(v, m4);
          q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        per = 32;
      } else {
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
        const float d = avx2::half_at(blk + 208);
        for (int j = 0; j < 16; j++) scale[j] = d * (float)sc[j];
        q6k_half(blk, blk + 128, q);
        q6k_half(blk + 64, blk + 160, q + 4);
        per = 16;
      }
      const float shift = T == Q4_K ? 0.0f : 32.0f;
      for (int i = 0; i < 32; i++) {  // 8 weights at a time: w = scale q - minus (Q4_K), scale (q - 32) (Q6_K)
        const __m128i bytes = i % 4 < 2 ? _mm256_castsi256_si128(q[i / 4]) : _mm256_extracti128_si256(q[i / 4], 1);
        const __m128i eight = i % 2 ? _mm_unpackhi_epi64(bytes, bytes) : bytes;
        const __m256 v = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight)), _mm256_set1_ps(shift));
        const int j = 8 * i / per;
        _mm256_storeu_ps(yb + 8 * i, _mm256_fmsub_ps(v, _mm256_set1_ps(scale[j]), _mm256_set1_ps(minus[8 * i / 32])));
      }
    }
}

// ---- AVX-512 (F, BW, VL, VNNI) ---------------------------------------------------------------------------------

// The 16 lanes of p = H + L 2^-15 over the 32 int16 weights q of one 32-block of x (lane i: weights 2i, 2i + 1).
PQ_K512 inline __m512 limb_dot512(__m512i q, const int16_t* h, const int16_t* l) {
  const __m512i H = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(h));
  const __m512i L = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(l));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(L), _mm512_set1_ps(1.0f / 32768.0f), _mm512_cvtepi32_ps(H));
}

template <int R>
PQ_K512 inline void q4k_block_avx512(const uint8_t* blk, const SplitX* sx, int64_t b, __m512 acc[2][R],
                                     __m256 off[R]) {
  alignas(32) float ds[R][8];
  q4k_scales_rows<R>(blk, sx, b, ds, off);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int g = 0; g < 4; g++) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g));
    const __m512i q[2] = {_mm512_cvtepu8_epi16(_mm256_and_si256(v, m4)),
                          _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4))};
    for (int half = 0; half < 2; half++)
      for (int r = 0; r < R; r++) {
        const int64_t xb = 8 * b + 2 * g + half;
        const __m512 p = limb_dot512(q[half], sx[r].h + 32 * xb, sx[r].l + 32 * xb);
        acc[half][r] = _mm512_fmadd_ps(p, _mm512_set1_ps(ds[r][2 * g + half]), acc[half][r]);
      }
  }
}

template <int R>
PQ_K512 inline void q6k_block_avx512(const uint8_t* blk, const SplitX* sx, int64_t b, __m512 acc[2][R]) {
  alignas(64) float dsc[16], ds[R][16];
  const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192))));
  _mm512_store_ps(dsc, _mm512_mul_ps(_mm512_set1_ps(avx2::half_at(blk + 208)), sc));
  row_scales<R, 16>(dsc, sx, 8 * b, 2, ds);
  const __m512i k32 = _mm512_set1_epi16(32);
  for (int half = 0; half < 2; half++) {
    __m256i q8[4];
    q6k_half(blk + 64 * half, blk + 128 + 32 * half, q8);
    for (int i = 0; i < 4; i++) {
      const int t = 4 * half + i;  // lanes 0..7 hold weights 0..15 (scale 2t), lanes 8..15 weights 16..31 (2t + 1)
      const __m512i q = _mm512_sub_epi16(_mm512_cvtepu8_epi16(q8[i]), k32);
      for (int r = 0; r < R; r++) {
        const int64_t xb = 8 * b + t;
        const __m512 s = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(ds[r][2 * t]), _mm512_set1_ps(ds[r][2 * t + 1]));
        acc[i % 2][r] = _mm512_fmadd_ps(limb_dot512(q, sx[r].h + 32 * xb, sx[r].l + 32 * xb), s, acc[i % 2][r]);
      }
    }
  }
}

// A Q5 block's 32 weights as the 32 int16 of a register: the nibbles in weight order, 16 added where the
// block's word has the weight's bit (the word is the lane mask), less 16 for Q5_0 (16 taken where it has not).
template <int64_t T, int R>
PQ_K512 inline void q5_block_avx512(const uint8_t* blk, const SplitX* sx, int64_t b, __m512 acc[R], float offs[R]) {
  constexpr int OFF = T == Q5_1 ? 4 : 2;
  uint32_t qh;
  std::memcpy(&qh, blk + OFF, 4);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + OFF + 4));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m256i nib = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(qs, m4)),
                                              _mm_and_si128(_mm_srli_epi16(qs, 4), m4), 1);
  const __m512i k16 = _mm512_set1_epi16(16), n = _mm512_cvtepu8_epi16(nib);
  // Q5_1: q = n + 16 where the bit is set; Q5_0: q - 16 = n - 16 where it is clear (one masked op either way)
  const __m512i q = T == Q5_0 ? _mm512_mask_sub_epi16(n, (__mmask32)~qh, n, k16)
                              : _mm512_mask_add_epi16(n, (__mmask32)qh, n, k16);
  const float d = avx2::half_at(blk);
  for (int r = 0; r < R; r++) {
    const __m512 p = limb_dot512(q, sx[r].h + 32 * b, sx[r].l + 32 * b);
    acc[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(d * sx[r].s[b]), acc[r]);
    if constexpr (T == Q5_1) offs[r] += avx2::half_at(blk + 2) * sx[r].sum[b];
  }
}

template <int64_t T, int R>
PQ_K512 inline void rows_avx512(const uint8_t* row, const SplitX* sx, int64_t nb, float* out, int64_t ldo) {
  constexpr int BYTES = layout_of(T).bytes;
  __m512 acc[2][R];
  __m256 off[R];
  float offs[R] = {};
  for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps(), off[r] = _mm256_setzero_ps();
  if constexpr (T == Q5_0 || T == Q5_1) {  // even and odd blocks in separate chains
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      q5_block_avx512<T, R>(row + b * BYTES, sx, b, acc[0], offs);
      q5_block_avx512<T, R>(row + (b + 1) * BYTES, sx, b + 1, acc[1], offs);
    }
    if (b < nb) q5_block_avx512<T, R>(row + b * BYTES, sx, b, acc[0], offs);
  } else {
    for (int64_t b = 0; b < nb; b++) {
      if constexpr (T == Q4_K) q4k_block_avx512<R>(row + b * BYTES, sx, b, acc, off);
      else q6k_block_avx512<R>(row + b * BYTES, sx, b, acc);
    }
  }
  for (int r = 0; r < R; r++)
    out[r * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r], acc[1][r])) - avx2::hsum(off[r]) + offs[r];
}

}  // namespace prefill_quant::kq
#endif
