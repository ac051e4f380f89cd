// The quantized matrix product shared by the operators of gemm.cpp and fused.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace prefill_quant {

enum Isa : int { SCALAR = 0, AVX2 = 1, AVX512 = 2 };  // AVX512: F, BW, VL and VNNI (and AVX2)
int current_isa();

// A weight [N, K] as GGUF blocks of `type`: N rows of row_bytes bytes.
struct QMatrix {
  const uint8_t* data;
  int64_t type, N, K, row_bytes;
};

// Checks `w` (contiguous uint8 on the CPU, N * row_bytes bytes) and describes it; K comes from the row width.
QMatrix qmatrix(const at::Tensor& w, int64_t type);

// out[m * N + n] = sum_k x[m * K + k] w[n][k] for m < M, n < N (parallel over N).
void matmul(const float* x, int64_t M, const QMatrix& w, float* out);

// The same product with x quantised per 32-block to int8 (q8.cpp; Q4_0, Q4_1, Q8_0); false, with nothing
// written, when it does not run (another type, an inf or a NaN in x), and the float path runs instead.
bool matmul_q8(const float* x, int64_t M, const QMatrix& w, float* out);

// The plain-layout types (kquants.cpp; Q4_K, Q6_K, Q5_0, Q5_1): the same product for M <= 4 rows straight from the blocks, and a
// panel's decoding into float32, on the instruction set in use; false, with nothing written, where they do not
// run (another type, the scalar instruction set, more rows, an inf or a NaN in x), and the portable path runs.
bool matmul_kquant(const float* x, int64_t M, const QMatrix& w, float* out);
bool dequant_rows_kquant(int isa, int64_t t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y);

}  // namespace prefill_quant
