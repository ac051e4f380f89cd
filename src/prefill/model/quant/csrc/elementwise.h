// Row-wise work of a decoder block around its GEMMs, in float32: RMSNorm, rotary, SiLU- and GELU-gated products.
// Each comes in a portable form and, where it pays, an AVX2 form; both round as the torch ops they replace do
// (no fused multiply-adds: the library is built with -ffp-contract=off), up to the exp() inside SiLU.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PQ_AVX2_EW __attribute__((target("avx2,fma,f16c")))
#endif

namespace prefill_quant {

// y = x * rsqrt(mean(x^2) + eps) * w over one row of K (the order of torch's rms_norm).
inline void rmsnorm_row(const float* x, int64_t K, const float* w, float eps, float* y) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums, as a vectorised reduction keeps them
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; j++) part[j] += x[k + j] * x[k + j];
  float ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  for (; k < K; k++) ss += x[k] * x[k];
  const float rstd = 1.0f / std::sqrt(ss / (float)K + eps);
  for (k = 0; k < K; k++) y[k] = (x[k] * rstd) * w[k];
}

// Rotary on the first `heads` heads of a row of width-d heads: the half-split form, (a, b) ->
// (a cos - b sin, b cos + a sin) for element i and i + d / 2 of each head, cos and sin [d] of this position.
inline void rotary_row(float* v, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; h++, v += d)
    for (int64_t i = 0; i < half; i++) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] + (-b) * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

inline void silu_mul_row_scalar(const float* gate, const float* up, int64_t F, float* out) {
  for (int64_t i = 0; i < F; i++) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// GELU's tanh form (Gemma): 0.5 g (1 + tanh(u)), u = sqrt(2 / pi) (g + 0.044715 g^3), written as g / (1 + exp(-2u))
// (the same function: 1 + tanh(u) = 2 / (1 + exp(-2u))), which keeps a few ulps where 1 + tanh(u) cancels (g
// very negative) and shares SiLU's exp.
constexpr float GELU_C = 0.7978845608028654f, GELU_A = 0.044715f;

inline void gelu_mul_row_scalar(const float* gate, const float* up, int64_t F, float* out) {
  for (int64_t i = 0; i < F; i++) {
    const float g = gate[i], u = GELU_C * (g + GELU_A * (g * g * g));
    out[i] = g / (1.0f + std::exp(-2.0f * u)) * up[i];
  }
}

#if defined(__x86_64__) || defined(_M_X64)
// exp(x) for 8 lanes, Cephes' single-precision polynomial (about 1 ulp on the range SiLU uses).
PQ_AVX2_EW inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                                 _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up.
PQ_AVX2_EW inline void silu_mul_row_avx2(const float* gate, const float* up, int64_t F, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= F; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  silu_mul_row_scalar(gate + i, up + i, F - i, out + i);
}

// out = gelu_tanh(gate) * up, as gelu_mul_row_scalar (exp8 for exp: the two differ by an ulp or two).
PQ_AVX2_EW inline void gelu_mul_row_avx2(const float* gate, const float* up, int64_t F, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), c = _mm256_set1_ps(GELU_C), a = _mm256_set1_ps(GELU_A);
  const __m256 minus2 = _mm256_set1_ps(-2.0f);
  for (; i + 8 <= F; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 u = _mm256_mul_ps(c, _mm256_add_ps(g, _mm256_mul_ps(a, cube)));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_mul_ps(minus2, u))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  gelu_mul_row_scalar(gate + i, up + i, F - i, out + i);
}
#endif

}  // namespace prefill_quant
