// AVX2 kernels over the x8 layout (packed.h): one lane per weight row, eight rows at a time.
//
// - dot_group_rows: 1-4 activation rows (decode, short prompts) against a group of eight rows. Each 16 bytes of
//   a segment hold two bytes of each row; widened to int16 they meet the activations' two int16 limbs (SplitX,
//   simd_avx2.h) broadcast to every lane, in exact int32 dot products (_mm256_madd_epi16). The eight rows'
//   scales and offsets come as one vector each: no horizontal sum, no scalar per block.
// - decode_group: a group's weights as float32 [K][16] (eight lanes of this group, beside a second group's),
//   for the M >= 5 kernel `tile_x8`, which broadcasts one x value against 16 weight rows: out[m][n0 .. n0 + 16].
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "packed.h"
#include "simd_avx2.h"

namespace prefill_quant::avx2 {

// Bytes of a segment before the weights: the eight d (and, for Q4_1, the eight m), as halves.
template <int64_t T>
constexpr int header_bytes() {
  return T == Q4_1 ? 32 : 16;
}

PQ_AVX2 inline __m256 halves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The eight rows' offsets m of a Q4 segment (w = q d + m): Q4_1 stores them, Q4_0's is -8 d ((q - 8) d).
template <int64_t T>
PQ_AVX2 inline __m256 offsets(const uint8_t* seg) {
  return T == Q4_1 ? halves(seg + 16) : _mm256_mul_ps(halves(seg), _mm256_set1_ps(-8.0f));
}

PQ_AVX2 inline __m256i pair_at(const int16_t* p) {  // x[p], x[p + 1] in every 32-bit lane (a broadcast load)
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Keeps the compiler from reordering a chain of integer adds (it would gather all products first and spill).
PQ_AVX2 inline void pin(__m256i& v) { asm volatile("" : "+x"(v)); }

// R = 1..4 activation rows against group `grp` (nb segments): out[r * ldo + 0..8) = sum_k w[i][k] x_r[k]. Each
// 16-byte load of weights is widened once and met by every row's limbs (sx[r], split_x). Per block and row:
// H = sum q h and L = sum q l exact in int32 (Q4: |H| <= 32 * 15 * 16383 < 2^24; Q8_0 up to 2^26, rounded once
// on conversion), then d_i s_b (H + L / 2^15) into weight row i's lane; the offsets m_i sum_b x go into
// another accumulator in the same pass for one row, and in a second pass over the group's segments (in L1 by
// then) for more, which keeps the accumulators in registers. For one row the second pass cost 11-13%.
template <int64_t T, int R>
PQ_AVX2 inline void dot_group_rows(const uint8_t* grp, const SplitX* sx, int64_t nb, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= 4);
  constexpr int BYTES = layout_of(T).bytes, SEG = 8 * BYTES, HDR = header_bytes<T>();
  constexpr int64_t PREFETCH = 4096;  // bytes ahead; 1 KB streamed 12% slower at 1 and 2 threads
  __m256 acc[R], off = _mm256_setzero_ps();
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  const __m256 inv15 = _mm256_set1_ps(1.0f / 32768.0f);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* seg = grp + b * SEG;
    for (int c = 0; c < SEG; c += 64) _mm_prefetch(reinterpret_cast<const char*>(seg + PREFETCH + c), _MM_HINT_T0);
    const uint8_t* qs = seg + HDR;
    __m256i H[R], L[R];
    for (int r = 0; r < R; r++) H[r] = L[r] = _mm256_setzero_si256();
    if constexpr (T == Q8_0) {
      for (int j = 0; j < 16; j++) {  // unit j: weights 2j, 2j + 1 of each row
        const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * j)));
        for (int r = 0; r < R; r++) {
          H[r] = _mm256_add_epi32(H[r], _mm256_madd_epi16(q, pair_at(sx[r].h + 32 * b + 2 * j)));
          L[r] = _mm256_add_epi32(L[r], _mm256_madd_epi16(q, pair_at(sx[r].l + 32 * b + 2 * j)));
          if constexpr (R == 1) pin(H[r]), pin(L[r]);
        }
      }
    } else {
      const __m256i low4 = _mm256_set1_epi16(0xf);
      for (int j = 0; j < 8; j++) {  // unit j: weights 2j, 2j + 1 (low nibbles) and 2j + 16, 2j + 17 (high)
        const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * j)));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_srli_epi16(v, 4);
        for (int r = 0; r < R; r++) {
          const int16_t* h = sx[r].h + 32 * b;
          const int16_t* l = sx[r].l + 32 * b;
          H[r] = _mm256_add_epi32(H[r], _mm256_add_epi32(_mm256_madd_epi16(lo, pair_at(h + 2 * j)),
                                                         _mm256_madd_epi16(hi, pair_at(h + 16 + 2 * j))));
          L[r] = _mm256_add_epi32(L[r], _mm256_add_epi32(_mm256_madd_epi16(lo, pair_at(l + 2 * j)),
                                                         _mm256_madd_epi16(hi, pair_at(l + 16 + 2 * j))));
          if constexpr (R == 1) pin(H[r]), pin(L[r]);
        }
      }
    }
    const __m256 d = halves(seg);
    for (int r = 0; r < R; r++) {
      const __m256 p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L[r]), inv15, _mm256_cvtepi32_ps(H[r]));
      acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(d, _mm256_set1_ps(sx[r].s[b])), acc[r]);
    }
    if constexpr (R == 1 && T != Q8_0) off = _mm256_fmadd_ps(offsets<T>(seg), _mm256_set1_ps(sx[0].sum[b]), off);
  }
  for (int r = 0; r < R; r++) {
    if constexpr (R > 1 && T != Q8_0) {
      off = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; b++) off = _mm256_fmadd_ps(offsets<T>(grp + b * SEG), _mm256_set1_ps(sx[r].sum[b]), off);
    }
    _mm256_storeu_ps(out + r * ldo, _mm256_add_ps(acc[r], off));
  }
}

// Group `grp` decoded to float32 w = q d + m into wt[k * ld + 0..8) for k < K (ld = 16: two groups side by side).
template <int64_t T>
PQ_AVX2 inline void decode_group(const uint8_t* grp, int64_t nb, float* wt, int64_t ld) {
  constexpr int BYTES = layout_of(T).bytes, SEG = 8 * BYTES, HDR = header_bytes<T>();
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* seg = grp + b * SEG;
    const uint8_t* qs = seg + HDR;
    const __m256 d = halves(seg);
    float* w = wt + 32 * b * ld;
    if constexpr (T == Q8_0) {
      for (int j = 0; j < 16; j++) {
        const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * j)));
        const __m256i even = _mm256_srai_epi32(_mm256_slli_epi32(q, 16), 16), odd = _mm256_srai_epi32(q, 16);
        _mm256_storeu_ps(w + (2 * j) * ld, _mm256_mul_ps(_mm256_cvtepi32_ps(even), d));
        _mm256_storeu_ps(w + (2 * j + 1) * ld, _mm256_mul_ps(_mm256_cvtepi32_ps(odd), d));
      }
    } else {
      const __m256 m = offsets<T>(seg);
      const __m256i low4 = _mm256_set1_epi16(0xf);
      for (int j = 0; j < 8; j++) {
        const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * j)));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_srli_epi16(v, 4);
        const __m256i q[4] = {_mm256_and_si256(lo, low16), _mm256_srli_epi32(lo, 16), _mm256_and_si256(hi, low16),
                              _mm256_srli_epi32(hi, 16)};
        const int64_t k[4] = {2 * j, 2 * j + 1, 16 + 2 * j, 17 + 2 * j};
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(w + k[i] * ld, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[i]), d, m));
      }
    }
  }
}

// out[i][0 .. 8 NG) = sum_k x[i][k] wt[k][0 .. 8 NG) for i < MR: x[i][k] broadcast against NG lanes of weights.
// The accumulators are named variables, not an array: GCC kept an array of them in memory, storing all twelve
// every k (half the speed).
#define PQ_ROW(i)                                                              \
  if constexpr (MR > i) {                                                      \
    const __m256 xv = _mm256_broadcast_ss(x + i * ldx + k);                    \
    a##i##0 = _mm256_fmadd_ps(xv, w0, a##i##0);                                \
    if constexpr (NG > 1) a##i##1 = _mm256_fmadd_ps(xv, w1, a##i##1);          \
  }
#define PQ_STORE(i)                                                            \
  if constexpr (MR > i) {                                                      \
    _mm256_storeu_ps(out + i * ldo, a##i##0);                                  \
    if constexpr (NG > 1) _mm256_storeu_ps(out + i * ldo + 8, a##i##1);        \
  }
template <int MR, int NG>
PQ_AVX2 inline void tile_x8(const float* x, int64_t ldx, const float* wt, int64_t K, float* out, int64_t ldo) {
  static_assert(MR >= 1 && MR <= 6 && (NG == 1 || NG == 2));
  const __m256 z = _mm256_setzero_ps();
  __m256 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z, a40 = z, a41 = z, a50 = z, a51 = z;
  for (int64_t k = 0; k < K; k++) {
    const __m256 w0 = _mm256_loadu_ps(wt + k * 16);
    const __m256 w1 = NG > 1 ? _mm256_loadu_ps(wt + k * 16 + 8) : z;
    PQ_ROW(0) PQ_ROW(1) PQ_ROW(2) PQ_ROW(3) PQ_ROW(4) PQ_ROW(5)
  }
  PQ_STORE(0) PQ_STORE(1) PQ_STORE(2) PQ_STORE(3) PQ_STORE(4) PQ_STORE(5)
}
#undef PQ_ROW
#undef PQ_STORE

}  // namespace prefill_quant::avx2
#endif
