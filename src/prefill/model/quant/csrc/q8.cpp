// The 8-bit activation path's dispatch (q8.h): a matrix whose type carries ACT_Q8 (packed.h) multiplies its
// activations quantised per 32-block to int8, on the kernel of the instruction set in use (gemm.h's
// current_isa(): AVX-512 VNNI, AVX2 or scalar). Whole groups of the x8 layout go to the SIMD kernels; plain
// rows (a matrix not packed, the N % 8 last rows) to the scalar kernel, which gives the same bits.
#include <ATen/Parallel.h>

#include <atomic>
#include <memory>

#include "gemm.h"
#include "q8.h"
#include "q8_avx2.h"
#include "q8_avx512.h"

namespace prefill_quant {
namespace {

constexpr int64_t GROUP_GRAIN = 2;  // groups a thread takes at least (16 rows, as the float path's panels)
// Activation rows a thread meets its weights with at a time, so that their int8 tiles (ROW_CHUNK x K bytes:
// 147 KiB at K = 576) stay in L2 however long the prompt (the weights are read again per chunk, from L3).
constexpr int64_t ROW_CHUNK = 256;

template <int64_t T>
void groups(int isa, const QMatrix& w, int64_t g0, int64_t g1, const q8::QRows& x, int64_t m0, int64_t m1,
            float* out) {
#if defined(__x86_64__) || defined(_M_X64)
  if (isa == AVX512) return q8::groups_avx512<T>(w.data, w.row_bytes, g0, g1, x, m0, m1, out, w.N);
  if (isa == AVX2) return q8::groups_avx2<T>(w.data, w.row_bytes, g0, g1, x, m0, m1, out, w.N);
#endif
  const int64_t bytes = GROUP * w.row_bytes;
  std::unique_ptr<uint8_t[]> plain(new uint8_t[bytes]);  // [8, row_bytes]
  for (int64_t g = g0; g < g1; g++) {
    unpack_group(w.data + g * bytes, w.row_bytes, layout_of(T).bytes, plain.get());
    q8::rows_scalar<T>(plain.get(), w.row_bytes, 0, GROUP, x, m0, m1, out + g * GROUP, w.N);
  }
}

template <int64_t T>
void matmul_t(const q8::QRows& x, int64_t M, const QMatrix& w, float* out) {
  const int isa = current_isa();
  const int64_t full = w.type & PACKED ? w.N / GROUP : 0;  // whole groups in the x8 layout
  if (full > 0)
    at::parallel_for(0, full, GROUP_GRAIN, [&](int64_t g0, int64_t g1) {
      for (int64_t m = 0; m < M; m += ROW_CHUNK) groups<T>(isa, w, g0, g1, x, m, std::min(M, m + ROW_CHUNK), out);
    });
  const int64_t rest = full * GROUP;
  if (rest < w.N)
    at::parallel_for(rest, w.N, GROUP_GRAIN * GROUP, [&](int64_t n0, int64_t n1) {
      q8::rows_scalar<T>(w.data, w.row_bytes, n0, n1, x, 0, M, out, w.N);
    });
}

}  // namespace

bool matmul_q8(const float* xp, int64_t M, const QMatrix& w, float* out) {
  const int64_t t = w.type & TYPE_MASK, K = w.K, nb = K / q8::QK, tiles = (M + q8::TILE - 1) / q8::TILE;
  const int64_t padded = tiles * q8::TILE;
  std::unique_ptr<int8_t[]> q(new int8_t[(M + padded) * K]());   // [M, K] rows, then [tiles, nb, TILE, 32]
  std::unique_ptr<float[]> f(new float[2 * (M + padded) * nb]());  // d, s of the rows, then of the tiles
  std::unique_ptr<int32_t[]> sums(new int32_t[(M + padded) * nb]());
  int8_t* tq = q.get() + M * K;
  float *td = f.get() + 2 * M * nb, *ts = td + padded * nb;
  int32_t* tsum = sums.get() + M * nb;
  const q8::QRows x{q.get(), f.get(), sums.get(), f.get() + M * nb, tq, td, tsum, ts, K, nb};
  std::atomic<bool> ok{true};
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1 && ok; m++) {
      if (!q8::quantize_row(xp + m * K, K, q.get() + m * K, f.get() + m * nb, sums.get() + m * nb,
                            f.get() + (M + m) * nb))
        ok = false;
      else
        q8::to_tiles(x, m, t != Q8_0, tq, td, tsum, ts);
    }
  });
  if (!ok) return false;
  switch (t) {
    case Q4_0: matmul_t<Q4_0>(x, M, w, out); return true;
    case Q4_1: matmul_t<Q4_1>(x, M, w, out); return true;
    case Q8_0: matmul_t<Q8_0>(x, M, w, out); return true;
    default: return false;
  }
}

}  // namespace prefill_quant
