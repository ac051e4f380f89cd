// AVX-512 VNNI kernel of the 8-bit activation path (q8.h) over the x8 layout (packed.h): two groups (16 weight
// rows) in the 16 lanes of a register, R <= 8 activation rows against each weight vector (each weight read once).
//
// _mm512_dpbusd_epi32 adds 4 products u8 x s8 into each 32-bit lane without saturating, so the Q4 nibbles go in
// as they are, and Q8_0's signed weights as w + 128 (w ^ 0x80) with 128 sum q_x taken off the block's sum. The
// lanes hold rows [g r0-3, g' r0-3, g r4-7, g' r4-7] (what the in-lane unpacks give); the scales are permuted to
// that order once a block, and the outputs back on store.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstring>

#include "q8.h"

#define PQ_Q8_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace prefill_quant::q8 {

PQ_Q8_512 inline __m512i bcast4_512(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

PQ_Q8_512 inline __m256i two16(const uint8_t* a, const uint8_t* b) {  // [16 bytes at a | 16 bytes at b]
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}

PQ_Q8_512 inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Lane order [g 0-3, g' 0-3, g 4-7, g' 4-7] from [g 0-7, g' 0-7], and back (the permutation is its own inverse).
PQ_Q8_512 inline __m512 lanes(__m512 v) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15), v);
}

PQ_Q8_512 inline __m512 halves16(const uint8_t* a, const uint8_t* b) {  // 8 halves at a, 8 at b, in lane order
  return lanes(_mm512_cvtph_ps(two16(a, b)));
}

// Groups at ga, gb (the same pointer for a lone last group) against the R first rows of activation tile
// `tile`: out[r * ldo + 0..8) for ga, + 8..16) for gb when `both`. Each row's block sum runs in C chains (the
// units' dpbusd latency would bind one chain when R is small); integer adds, so the chains change no bit.
template <int64_t T, int R>
PQ_Q8_512 void pair_avx512(const uint8_t* ga, const uint8_t* gb, bool both, const QRows& x, int64_t tile,
                           int64_t ahead, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= TILE);
  constexpr int SEG = 8 * layout_of(T).bytes, HDR = T == Q4_1 ? 32 : 16, C = R <= 2 ? 4 : R <= 4 ? 2 : 1;
  __m512 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.nb; b++) {
    const uint8_t *sa = ga + b * SEG, *sb = gb + b * SEG;
    for (int c = 0; c < SEG; c += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(sa + ahead + c), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sb + ahead + c), _MM_HINT_T0);
    }
    const int64_t at = x.at(tile, b);
    const int8_t* xq = x.tq + at * QK;  // row r's block at xq + 32 r
    __m512i I[C][R];
    for (int c = 0; c < C; c++)
      for (int r = 0; r < R; r++) I[c][r] = _mm512_setzero_si512();
    if constexpr (T == Q8_0) {
      const __m512i flip = _mm512_set1_epi8((char)0x80);
      for (int j = 0; j < 16; j += 2) {
        const __m256i a = two16(sa + HDR + 16 * j, sb + HDR + 16 * j);
        const __m256i c = two16(sa + HDR + 16 * j + 16, sb + HDR + 16 * j + 16);
        const __m512i w = _mm512_xor_si512(join(_mm256_unpacklo_epi16(a, c), _mm256_unpackhi_epi16(a, c)), flip);
        for (int r = 0; r < R; r++)
          I[j / 2 % C][r] = _mm512_dpbusd_epi32(I[j / 2 % C][r], w, bcast4_512(xq + 32 * r + 2 * j));
      }
    } else {
      const __m256i low4 = _mm256_set1_epi8(0xf);
      for (int j = 0; j < 8; j++) {
        const __m256i v = two16(sa + HDR + 16 * j, sb + HDR + 16 * j);
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        const __m512i w = join(_mm256_unpacklo_epi16(lo, hi), _mm256_unpackhi_epi16(lo, hi));
        for (int r = 0; r < R; r++) I[j % C][r] = _mm512_dpbusd_epi32(I[j % C][r], w, bcast4_512(xq + 32 * r + 4 * j));
      }
    }
    const __m512 dw = halves16(sa, sb);
    const __m512 mw = T == Q4_1 ? halves16(sa + 16, sb + 16) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
      __m512i sum = I[0][r];
      for (int c = 1; c < C; c++) sum = _mm512_add_epi32(sum, I[c][r]);
      if constexpr (T == Q8_0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * x.tsum[at + r]));
      if constexpr (T == Q4_0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(8 * x.tsum[at + r]));
      __m512 p = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(x.td[at + r])), _mm512_cvtepi32_ps(sum));
      if constexpr (T == Q4_1) p = _mm512_add_ps(p, _mm512_mul_ps(mw, _mm512_set1_ps(x.ts[at + r])));
      acc[r] = _mm512_add_ps(acc[r], p);
    }
  }
  for (int r = 0; r < R; r++) {
    const __m512 v = lanes(acc[r]);
    if (both) _mm512_storeu_ps(out + r * ldo, v);
    else _mm256_storeu_ps(out + r * ldo, _mm512_castps512_ps256(v));
  }
}

template <int64_t T>
PQ_Q8_512 void pair_rows(const uint8_t* ga, const uint8_t* gb, bool both, const QRows& x, int64_t tile, int64_t R,
                         int64_t ahead, float* o, int64_t ldo) {
  switch (R) {
    case 8: return pair_avx512<T, 8>(ga, gb, both, x, tile, ahead, o, ldo);
    case 7: return pair_avx512<T, 7>(ga, gb, both, x, tile, ahead, o, ldo);
    case 6: return pair_avx512<T, 6>(ga, gb, both, x, tile, ahead, o, ldo);
    case 5: return pair_avx512<T, 5>(ga, gb, both, x, tile, ahead, o, ldo);
    case 4: return pair_avx512<T, 4>(ga, gb, both, x, tile, ahead, o, ldo);
    case 3: return pair_avx512<T, 3>(ga, gb, both, x, tile, ahead, o, ldo);
    case 2: return pair_avx512<T, 2>(ga, gb, both, x, tile, ahead, o, ldo);
    default: return pair_avx512<T, 1>(ga, gb, both, x, tile, ahead, o, ldo);
  }
}

// Groups [g0, g1) of a packed matrix against rows [m0, m1) (m0 a multiple of TILE), two groups at a time:
// out [M, ldo], columns 8 g ..
template <int64_t T>
PQ_Q8_512 void groups_avx512(const uint8_t* w, int64_t row_bytes, int64_t g0, int64_t g1, const QRows& x,
                             int64_t m0, int64_t m1, float* out, int64_t ldo) {
  for (int64_t g = g0; g < g1; g += 2) {
    const bool both = g + 1 < g1;
    const uint8_t* ga = w + g * GROUP * row_bytes;
    const uint8_t* gb = both ? ga + GROUP * row_bytes : ga;
    // Each segment's counterpart in the next pair is asked for while this pair is read (a fixed 4 KiB ahead left
    // the second group of each pair cold: at M = 1 the Q8_0 unembedding ran 1.4x slower than the AVX2 kernel).
    const int64_t ahead = 2 * GROUP * row_bytes;
    for (int64_t m = m0; m < m1; m += TILE)
      pair_rows<T>(ga, gb, both, x, m / TILE, std::min<int64_t>(TILE, m1 - m), ahead, out + m * ldo + g * GROUP, ldo);
  }
}

}  // namespace prefill_quant::q8
#endif
