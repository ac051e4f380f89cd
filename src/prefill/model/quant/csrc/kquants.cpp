// The dispatch of the plain-layout types' kernels (Q4_K, Q6_K, Q5_0, Q5_1; kquants.h): up to FEW_ROWS rows of float32 activations straight
// from the blocks on the instruction set in use (current_isa(): AVX-512 VNNI, AVX2), and the panel path's
// decoding into float32. The scalar instruction set, and an activation row holding an inf or a NaN, take the
// portable panel path of gemm.cpp (blocks.h's decoder, then float32 products).
#include <ATen/Parallel.h>

#include <memory>

#include "gemm.h"
#include "kquants.h"
#include "packed.h"

namespace prefill_quant {
namespace {

#if defined(__x86_64__) || defined(_M_X64)
constexpr int64_t FEW_ROWS = 4;  // rows of x met in registers against each weight row (each weight read once)
constexpr int64_t ROW_GRAIN = 16;  // weight rows a thread takes at least
constexpr int64_t PREFETCH_BYTES = 1024;  // how far ahead the weights are asked for (they stream from memory)

template <int64_t T, int R>
void rows(int isa, const avx2::SplitX* sx, const QMatrix& w, int64_t n0, int64_t n1, float* out) {
  const int64_t nb = w.K / layout_of(T).block;
  for (int64_t n = n0; n < n1; n++) {
    const uint8_t* row = w.data + n * w.row_bytes;
    for (int64_t c = 0; c < w.row_bytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row + PREFETCH_BYTES + c), _MM_HINT_T0);
    if (isa == AVX512) kq::rows_avx512<T, R>(row, sx, nb, out + n, w.N);
    else kq::rows_avx2<T, R>(row, sx, nb, out + n, w.N);
  }
}

template <int64_t T>
void rows_t(int isa, int64_t M, const avx2::SplitX* sx, const QMatrix& w, int64_t n0, int64_t n1, float* out) {
  switch (M) {
    case 1: return rows<T, 1>(isa, sx, w, n0, n1, out);
    case 2: return rows<T, 2>(isa, sx, w, n0, n1, out);
    case 3: return rows<T, 3>(isa, sx, w, n0, n1, out);
    default: return rows<T, 4>(isa, sx, w, n0, n1, out);
  }
}
#endif

}  // namespace

bool matmul_kquant(const float* xp, int64_t M, const QMatrix& w, float* out) {
#if defined(__x86_64__) || defined(_M_X64)
  const int64_t t = w.type & TYPE_MASK, K = w.K, nb32 = K / 32;
  const int isa = current_isa();
  if (!kq::kquant(t) || isa < AVX2 || M > FEW_ROWS || M < 1) return false;
  std::unique_ptr<int16_t[]> hl(new int16_t[2 * M * K]);   // [M, 2, K]: each row's two limbs
  std::unique_ptr<float[]> sums(new float[2 * M * nb32]);  // [M, 2, K / 32]: its scales s and block sums
  avx2::SplitX sx[FEW_ROWS];
  for (int64_t m = 0; m < M; m++) {
    int16_t* h = hl.get() + 2 * m * K;
    float* s = sums.get() + 2 * m * nb32;
    sx[m] = {h, h + K, s, s + nb32};
    if (!avx2::split_x(xp + m * K, K, sx[m])) return false;  // an inf or a NaN: the float path propagates it
  }
  at::parallel_for(0, w.N, ROW_GRAIN, [&](int64_t n0, int64_t n1) {
    switch (t) {
      case Q4_K: return rows_t<Q4_K>(isa, M, sx, w, n0, n1, out);
      case Q6_K: return rows_t<Q6_K>(isa, M, sx, w, n0, n1, out);
      case Q5_0: return rows_t<Q5_0>(isa, M, sx, w, n0, n1, out);
      default: return rows_t<Q5_1>(isa, M, sx, w, n0, n1, out);
    }
  });
  return true;
#else
  return false;
#endif
}

bool dequant_rows_kquant(int isa, int64_t t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y) {
#if defined(__x86_64__) || defined(_M_X64)
  if (isa < AVX2 || !kq::kquant(t)) return false;
  switch (t) {
    case Q4_K: kq::dequant_rows_avx2<Q4_K>(w, row_bytes, rows, K, y); break;
    case Q6_K: kq::dequant_rows_avx2<Q6_K>(w, row_bytes, rows, K, y); break;
    case Q5_0: kq::dequant_rows_q5_avx2<Q5_0>(w, row_bytes, rows, K, y); break;
    default: kq::dequant_rows_q5_avx2<Q5_1>(w, row_bytes, rows, K, y); break;
  }
  return true;
#else
  return false;
#endif
}

}  // namespace prefill_quant
