// y = x @ w^T for float32 activations x [M, K] and weights w [N, K] (both K-contiguous), with every output
// element summed in one fixed order: an 8-lane accumulator over K in steps of 8, then a fixed horizontal sum,
// then the K % 8 tail. An element's value does not depend on M, on the other rows, on its place in a register
// tile or on the threads (work is split over N only): the batch-invariant mode's GEMM. It is also the fast path
// for the few rows of a decode step, where the weights stream from memory once for all rows (MR rows x NR
// weight rows of accumulators per tile).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LN_AVX2 __attribute__((target("avx2,fma")))
#define LN_HAVE_X86 1
#endif

namespace {

// One output element, scalar, in the same grouping as the AVX2 path (8 partial sums, summed pairwise).
inline float dot_scalar(const float* x, const float* w, int64_t K) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int i = 0; i < 8; i++) lane[i] = std::fma(x[k + i], w[k + i], lane[i]);
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (; k < K; k++) s = std::fma(x[k], w[k], s);
  return s;
}

void rows_scalar(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = n0; j < n1; j++) y[i * N + j] = dot_scalar(x + i * K, w + j * K, K);
}

#ifdef LN_HAVE_X86
LN_AVX2 inline float finish(__m256 v, const float* x, const float* w, int64_t k, int64_t K) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);                  // lanes (0+4, 1+5, 2+6, 3+7)
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));          // (0+4)+(2+6), (1+5)+(3+7)
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; k < K; k++) r = std::fma(x[k], w[k], r);
  return r;
}

// A tile of MR activation rows x NR weight rows; every accumulator sees the same FMA sequence over K.
// `next`: the weights of the column block after this one, fetched into the cache while this tile computes (the
// first tile of a block only; the others read this block's weights from L1), or nullptr.
template <int MR, int NR>
LN_AVX2 void tile(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t i0, int64_t j0,
                  const float* next) {
  __m256 acc[MR][NR];
  for (int a = 0; a < MR; a++)
    for (int b = 0; b < NR; b++) acc[a][b] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if (next != nullptr && (k & 15) == 0)  // one cache line (16 floats) of each next row per two steps
      for (int b = 0; b < NR; b++) _mm_prefetch(reinterpret_cast<const char*>(next + b * K + k), _MM_HINT_T0);
    __m256 wv[NR];
    for (int b = 0; b < NR; b++) wv[b] = _mm256_loadu_ps(w + (j0 + b) * K + k);
    for (int a = 0; a < MR; a++) {
      const __m256 xv = _mm256_loadu_ps(x + (i0 + a) * K + k);
      for (int b = 0; b < NR; b++) acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
    }
  }
  for (int a = 0; a < MR; a++)
    for (int b = 0; b < NR; b++) y[(i0 + a) * N + j0 + b] = finish(acc[a][b], x + (i0 + a) * K, w + (j0 + b) * K, k, K);
}

template <int NR>
LN_AVX2 void column_block(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t j0,
                          const float* next) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4, next = nullptr) tile<4, NR>(x, w, y, N, K, i, j0, next);
  for (; i + 2 <= M; i += 2, next = nullptr) tile<2, NR>(x, w, y, N, K, i, j0, next);
  for (; i < M; i++, next = nullptr) tile<1, NR>(x, w, y, N, K, i, j0, next);
}

LN_AVX2 void rows_avx2(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                       int64_t n1) {
  int64_t j = n0;
  for (; j + 3 <= n1; j += 3) column_block<3>(x, w, y, M, N, K, j, j + 6 <= n1 ? w + (j + 3) * K : nullptr);
  for (; j < n1; j++) column_block<1>(x, w, y, M, N, K, j, nullptr);
}

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
bool cpu_has_avx2() { return false; }
#endif

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w, bool allow_simd) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K] must share K");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "float32 only");
  auto xc = x.contiguous(), wc = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = at::empty({M, N}, x.options());
  const float *xp = xc.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const bool simd = allow_simd && cpu_has_avx2();
  // Work split over N only (in steps of 48 weight rows: whole tiles, never straddling two threads' ranges).
  at::parallel_for(0, (N + 47) / 48, 1, [&](int64_t lo, int64_t hi) {
    const int64_t n0 = lo * 48, n1 = std::min(N, hi * 48);
#ifdef LN_HAVE_X86
    if (simd) return rows_avx2(xp, wp, yp, M, N, K, n0, n1);
#endif
    rows_scalar(xp, wp, yp, M, N, K, n0, n1);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(prefill_kernels, m) {
  m.def("linear_f32(Tensor x, Tensor w, bool allow_simd) -> Tensor");
  m.impl("linear_f32", c10::DispatchKey::CPU, TORCH_FN(linear_f32));
}
