// AVX2 kernel of the 8-bit activation path (q8.h) over the x8 layout (packed.h): one 32-bit lane per weight row,
// eight rows of a group at a time, R <= 8 activation rows (a whole tile) against each weight vector (each weight
// read and widened once: at R = 8 against two passes of 4, a decode step of 8 rows costs 15-25% less, thread CPU
// time on a Zen 3; the accumulators no longer fit the 16 registers, and their spills cost less than a second pass).
//
// A 32-bit lane holds 4 weights of one row and meets 4 int8 activations broadcast to all lanes:
// _mm256_maddubs_epi16 (u8 weights x s8 activations, pairs summed into int16) then _mm256_madd_epi16 (pairs into
// int32). Q4 (nibbles 0..15): a pair is at most 2 * 15 * 127 = 3,810, so the 8 units of a block add up in int16
// (30,480 < 32,767) before one madd. Q8_0 (signed weights): maddubs needs an unsigned side, so |w| meets
// sign(w) x (llama.cpp's trick); a pair is at most 2 * 128 * 127 = 32,512, and each unit goes to int32.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstring>

#include "q8.h"

#define PQ_Q8_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace prefill_quant::q8 {

PQ_Q8_AVX2 inline __m256i bcast4(const int8_t* p) {  // 4 int8 in every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// A group's unit j (16 bytes: 2 of each row) as 4 nibbles a lane: row r = weights 2j, 2j+1, 2j+16, 2j+17.
PQ_Q8_AVX2 inline __m256i q4_unit(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), low4 = _mm_set1_epi8(0xf);
  const __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
  return _mm256_set_m128i(_mm_unpackhi_epi16(lo, hi), _mm_unpacklo_epi16(lo, hi));
}

// Units j, j + 1 of a Q8_0 group as 4 int8 a lane: row r = weights 2j .. 2j + 3.
PQ_Q8_AVX2 inline __m256i q8_units(const uint8_t* p) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  return _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
}

PQ_Q8_AVX2 inline __m256 halves8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Group `grp` (nb segments) against rows r0 .. r0 + R of activation tile `tile`: out[r * ldo + 0..8).
template <int64_t T, int R>
PQ_Q8_AVX2 void group_avx2(const uint8_t* grp, const QRows& x, int64_t tile, int r0, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= TILE);
  constexpr int SEG = 8 * layout_of(T).bytes, HDR = T == Q4_1 ? 32 : 16;
  constexpr int64_t PREFETCH = 4096;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < x.nb; b++) {
    const uint8_t* seg = grp + b * SEG;
    for (int c = 0; c < SEG; c += 64) _mm_prefetch(reinterpret_cast<const char*>(seg + PREFETCH + c), _MM_HINT_T0);
    const uint8_t* qs = seg + HDR;
    const int64_t at = x.at(tile, b) + r0;
    const int8_t* xq = x.tq + at * QK;  // row r's block at xq + 32 r
    __m256i I[R];
    if constexpr (T == Q8_0) {
      for (int r = 0; r < R; r++) I[r] = _mm256_setzero_si256();
      for (int j = 0; j < 16; j += 2) {
        const __m256i w = q8_units(qs + 16 * j), wabs = _mm256_sign_epi8(w, w);
        for (int r = 0; r < R; r++) {
          const __m256i xs = _mm256_sign_epi8(bcast4(xq + 32 * r + 2 * j), w);
          I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xs), ones));
        }
      }
    } else {
      __m256i S[R];
      for (int r = 0; r < R; r++) S[r] = _mm256_setzero_si256();
      for (int j = 0; j < 8; j++) {
        const __m256i w = q4_unit(qs + 16 * j);
        for (int r = 0; r < R; r++) S[r] = _mm256_add_epi16(S[r], _mm256_maddubs_epi16(w, bcast4(xq + 32 * r + 4 * j)));
      }
      for (int r = 0; r < R; r++) {
        I[r] = _mm256_madd_epi16(S[r], ones);
        if constexpr (T == Q4_0) I[r] = _mm256_sub_epi32(I[r], _mm256_set1_epi32(8 * x.tsum[at + r]));
      }
    }
    const __m256 dw = halves8(seg);
    const __m256 mw = T == Q4_1 ? halves8(seg + 16) : _mm256_setzero_ps();
    for (int r = 0; r < R; r++) {
      __m256 p = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x.td[at + r])), _mm256_cvtepi32_ps(I[r]));
      if constexpr (T == Q4_1) p = _mm256_add_ps(p, _mm256_mul_ps(mw, _mm256_set1_ps(x.ts[at + r])));
      acc[r] = _mm256_add_ps(acc[r], p);
    }
  }
  for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * ldo, acc[r]);
}

// Groups [g0, g1) of a packed matrix against rows [m0, m1) (m0 a multiple of TILE): out [M, ldo], columns 8 g ..
template <int64_t T>
PQ_Q8_AVX2 void groups_avx2(const uint8_t* w, int64_t row_bytes, int64_t g0, int64_t g1, const QRows& x, int64_t m0,
                            int64_t m1, float* out, int64_t ldo) {
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* grp = w + g * GROUP * row_bytes;
    static_assert(TILE == 8, "the cases below spell out R = 1 .. 8");
    for (int64_t m = m0; m < m1; m += TILE) {
      float* o = out + m * ldo + g * GROUP;
      const int64_t tile = m / TILE;
      switch (std::min<int64_t>(TILE, m1 - m)) {
        case 8: group_avx2<T, 8>(grp, x, tile, 0, o, ldo); break;
        case 7: group_avx2<T, 7>(grp, x, tile, 0, o, ldo); break;
        case 6: group_avx2<T, 6>(grp, x, tile, 0, o, ldo); break;
        case 5: group_avx2<T, 5>(grp, x, tile, 0, o, ldo); break;
        case 4: group_avx2<T, 4>(grp, x, tile, 0, o, ldo); break;
        case 3: group_avx2<T, 3>(grp, x, tile, 0, o, ldo); break;
        case 2: group_avx2<T, 2>(grp, x, tile, 0, o, ldo); break;
        default: group_avx2<T, 1>(grp, x, tile, 0, o, ldo); break;
      }
    }
  }
}

}  // namespace prefill_quant::q8
#endif
