// torch.ops.prefill_quant: float32 activations x [M, K] times a GGUF-quantized weight [N, K] kept as its raw
// blocks (uint8 [N, row_bytes]), dequantized in registers. out[m][n] = sum_k x[m][k] w[n][k], i.e. F.linear.
//
//   gemm(x, w, qtype, N, K) -> [M, N]   M = 1: direct dot per row, or per group of 8 rows in the x8 layout
//                                        (no weight materialised; in the x8 layout, and Q4_K / Q6_K / Q5
//                                        (kquants.cpp), also M = 2-4);
//                                        else weight panels decoded into L1/L2, reused by all rows.
//                                        qtype | ACT_Q8 (packed.h): the activations quantised to int8 per
//                                        32-block instead (q8.cpp; Q4_0, Q4_1, Q8_0), dispatched in matmul().
//   dequant(w, qtype, N, K) -> [N, K] float32         the same decoding, whole.
//   pack(w, qtype, N, K) -> uint8 [N, row_bytes]      the blocks in the x8 layout (packed.h); its type is
//                                                      qtype | PACKED, which every operator here accepts.
//   set_isa(name) -> name                             "auto", "avx512", "avx2" or "scalar" (tests force each
//                                                      kernel; avx512 = F, BW, VL, VNNI: the 8-bit activation
//                                                      kernel, q8.cpp, and the few-rows kernel of Q4_K, Q6_K, Q5,
//                                                      kquants.cpp; the other float32 kernels run AVX2 code).
//   pre_attention, post_attention, decode_block       a decoder block's work around attention, or all of it (fused.cpp).
//
// Work is split over N with at::parallel_for (torch's own thread pool and thread count).
#include "gemm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <string>

#include "blocks.h"
#include "packed.h"
#include "packed_avx2.h"
#include "simd_avx2.h"

namespace prefill_quant {
namespace {

int best_isa() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) return SCALAR;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni"))
    return AVX512;
  return AVX2;
#endif
  return SCALAR;
}

std::atomic<int> g_isa{best_isa()};

const char* isa_name(int isa) { return isa == AVX512 ? "avx512" : isa >= AVX2 ? "avx2" : "scalar"; }

constexpr int64_t PANEL = 16;  // weight rows decoded at a time: 16 x K floats (96 KiB at K = 1,536) stay in L2
constexpr int MR = 4, NR = 3;  // register tile: 4 x 3 accumulators of 8 lanes (+ 3 weight vectors + 1 of x)
constexpr int64_t PREFETCH_BYTES = 1024;  // how far ahead the decode kernel asks for its weights

// ---- portable scalar path ------------------------------------------------------------------------------

void tile_scalar(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* out, int64_t ldo,
                 int mr, int nr) {
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; k++) s += x[i * ldx + k] * w[j * ldw + k];
      out[i * ldo + j] = s;
    }
}

// ---- dispatch --------------------------------------------------------------------------------------------

void dequant_rows(int isa, int64_t t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t K, float* y) {
#if defined(__x86_64__) || defined(_M_X64)
  if (isa >= AVX2) {
    switch (t) {
      case Q4_0: return avx2::dequant_rows_t<Q4_0>(w, row_bytes, rows, K, y);
      case Q4_1: return avx2::dequant_rows_t<Q4_1>(w, row_bytes, rows, K, y);
      case Q8_0: return avx2::dequant_rows_t<Q8_0>(w, row_bytes, rows, K, y);
      default: if (dequant_rows_kquant(isa, t, w, row_bytes, rows, K, y)) return;  // Q4_K, Q6_K, Q5_0, Q5_1
    }
  }
#endif
  for (int64_t r = 0; r < rows; r++) dequant_row_scalar(t, w + r * row_bytes, K, y + r * K);
}

template <int R>
void tile_avx2_nr(int nr, const float* x, int64_t ldx, const float* w, int64_t K, float* out, int64_t ldo) {
#if defined(__x86_64__) || defined(_M_X64)
  switch (nr) {
    case 3: return avx2::tile<R, 3>(x, ldx, w, K, K, out, ldo);
    case 2: return avx2::tile<R, 2>(x, ldx, w, K, K, out, ldo);
    default: return avx2::tile<R, 1>(x, ldx, w, K, K, out, ldo);
  }
#endif
}

void tile(int isa, int mr, int nr, const float* x, const float* w, int64_t K, float* out, int64_t ldo) {
  if (isa >= AVX2) {
    switch (mr) {
      case 4: return tile_avx2_nr<4>(nr, x, K, w, K, out, ldo);
      case 3: return tile_avx2_nr<3>(nr, x, K, w, K, out, ldo);
      case 2: return tile_avx2_nr<2>(nr, x, K, w, K, out, ldo);
      default: return tile_avx2_nr<1>(nr, x, K, w, K, out, ldo);
    }
  }
  tile_scalar(x, K, w, K, K, out, ldo, mr, nr);
}

// Weight rows [n0, n1) against all M rows of x, one decoded panel at a time.
void panel_rows(int isa, int64_t t, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t row_bytes,
                int64_t n0, int64_t n1, float* out, int64_t N) {
  std::unique_ptr<float[]> buf(new float[PANEL * K]);  // [PANEL, K]
  for (int64_t p = n0; p < n1; p += PANEL) {
    const int64_t rows = std::min(PANEL, n1 - p);
    dequant_rows(isa, t, w + p * row_bytes, row_bytes, rows, K, buf.get());
    for (int64_t m = 0; m < M; m += MR)
      for (int64_t j = 0; j < rows; j += NR)
        tile(isa, (int)std::min<int64_t>(MR, M - m), (int)std::min<int64_t>(NR, rows - j), x + m * K,
             buf.get() + j * K, K, out + m * N + p + j, N);
  }
}

#if defined(__x86_64__) || defined(_M_X64)
// M = 1: one dot per weight row, straight from the blocks, against the split activations (simd_avx2.h).
void m1_rows(int64_t t, const avx2::SplitX& sx, int64_t K, const uint8_t* w, int64_t row_bytes, int64_t n0,
             int64_t n1, float* out) {
  const int64_t nb = K / 32;
  for (int64_t n = n0; n < n1; n++) {
    const uint8_t* row = w + n * row_bytes;
    for (int64_t c = 0; c < row_bytes; c += 64)  // the rows about a KiB ahead: the weights stream from memory
      _mm_prefetch(reinterpret_cast<const char*>(row + PREFETCH_BYTES + c), _MM_HINT_T0);
    out[n] = t == Q4_1   ? avx2::dot_row_m1<Q4_1>(row, sx, nb)
             : t == Q4_0 ? avx2::dot_row_m1<Q4_0>(row, sx, nb)
                         : avx2::dot_row_m1<Q8_0>(row, sx, nb);
  }
}
#endif

// ---- the x8 layout (packed.h) ------------------------------------------------------------------------------

#if defined(__x86_64__) || defined(_M_X64)
template <int MR>
void tile_x8_ng(int ng, const float* x, int64_t K, const float* wt, float* out, int64_t ldo) {
  if (ng == 2) return avx2::tile_x8<MR, 2>(x, K, wt, K, out, ldo);
  avx2::tile_x8<MR, 1>(x, K, wt, K, out, ldo);
}

void tile_x8(int mr, int ng, const float* x, int64_t K, const float* wt, float* out, int64_t ldo) {
  switch (mr) {
    case 6: return tile_x8_ng<6>(ng, x, K, wt, out, ldo);
    case 5: return tile_x8_ng<5>(ng, x, K, wt, out, ldo);
    case 4: return tile_x8_ng<4>(ng, x, K, wt, out, ldo);
    case 3: return tile_x8_ng<3>(ng, x, K, wt, out, ldo);
    case 2: return tile_x8_ng<2>(ng, x, K, wt, out, ldo);
    default: return tile_x8_ng<1>(ng, x, K, wt, out, ldo);
  }
}

void decode_group(int64_t t, const uint8_t* grp, int64_t nb, float* wt) {
  switch (t) {
    case Q4_0: return avx2::decode_group<Q4_0>(grp, nb, wt, 16);
    case Q4_1: return avx2::decode_group<Q4_1>(grp, nb, wt, 16);
    default: return avx2::decode_group<Q8_0>(grp, nb, wt, 16);
  }
}

// Groups [g0, g1) of a packed matrix against all M rows of x: two groups decoded at a time into wt [K][16].
void packed_groups_avx2(const float* x, int64_t M, const QMatrix& w, int64_t g0, int64_t g1, float* out) {
  constexpr int MR_X8 = 6;  // 6 x 2 accumulators + 2 weight vectors + 1 broadcast x: 15 of 16 registers
  const int64_t t = w.type & TYPE_MASK, K = w.K, nb = K / 32;
  std::unique_ptr<float[]> wt(new float[16 * K]);  // [K, 16]
  for (int64_t g = g0; g < g1; g += 2) {
    const int ng = (int)std::min<int64_t>(2, g1 - g);
    for (int i = 0; i < ng; i++) decode_group(t, w.data + (g + i) * GROUP * w.row_bytes, nb, wt.get() + 8 * i);
    const int64_t tiles = (M + MR_X8 - 1) / MR_X8;  // M split evenly (8 rows: 4 + 4, not 6 + 2)
    for (int64_t i = 0, m = 0; i < tiles; i++) {
      const int64_t mr = (M - m) / (tiles - i);
      tile_x8((int)mr, ng, x + m * K, K, wt.get(), out + m * w.N + g * GROUP, w.N);
      m += mr;
    }
  }
}

template <int R>
void packed_rows_avx2(const avx2::SplitX* sx, const QMatrix& w, int64_t g0, int64_t g1, float* out) {
  const int64_t t = w.type & TYPE_MASK, nb = w.K / 32;
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* grp = w.data + g * GROUP * w.row_bytes;
    float* o = out + g * GROUP;
    if (t == Q4_1) avx2::dot_group_rows<Q4_1, R>(grp, sx, nb, o, w.N);
    else if (t == Q4_0) avx2::dot_group_rows<Q4_0, R>(grp, sx, nb, o, w.N);
    else avx2::dot_group_rows<Q8_0, R>(grp, sx, nb, o, w.N);
  }
}

// Groups [g0, g1) against M <= 4 rows of x, each split into integer limbs (sx[m]).
void packed_few_avx2(int64_t M, const avx2::SplitX* sx, const QMatrix& w, int64_t g0, int64_t g1, float* out) {
  switch (M) {
    case 1: return packed_rows_avx2<1>(sx, w, g0, g1, out);
    case 2: return packed_rows_avx2<2>(sx, w, g0, g1, out);
    case 3: return packed_rows_avx2<3>(sx, w, g0, g1, out);
    default: return packed_rows_avx2<4>(sx, w, g0, g1, out);
  }
}
#endif

// x [M, K] times a packed matrix: whole groups by the x8 kernels, the N % 8 plain rows at the end as before;
// without AVX2 every group is unpacked into plain blocks first and runs the portable path.
void matmul_packed(int isa, const float* xp, int64_t M, const QMatrix& w, float* op) {
  const int64_t t = w.type & TYPE_MASK, N = w.N, K = w.K, full = N / GROUP;
#if defined(__x86_64__) || defined(_M_X64)
  if (isa >= AVX2) {
    // Up to FEW_ROWS rows: each split into integer limbs (the M = 1 arithmetic); false when a row cannot be
    // (an inf or a NaN), and then the float path runs them all.
    constexpr int64_t FEW_ROWS = 4;
    std::unique_ptr<int16_t[]> hl;
    std::unique_ptr<float[]> sums;
    avx2::SplitX sx[FEW_ROWS];
    bool split = M <= FEW_ROWS;
    if (split) {
      hl.reset(new int16_t[2 * M * K]);  // [M, 2, K]
      sums.reset(new float[2 * M * (K / 32)]);
      for (int64_t m = 0; m < M && split; m++) {
        int16_t* h = hl.get() + 2 * m * K;
        float* s = sums.get() + 2 * m * (K / 32);
        sx[m] = {h, h + K, s, s + K / 32};
        split = avx2::split_x(xp + m * K, K, sx[m]);
      }
    }
    at::parallel_for(0, full + (N % GROUP ? 1 : 0), PANEL / GROUP, [&](int64_t g0, int64_t g1) {
      const int64_t whole = std::min(g1, full);
      if (g0 < whole) {
        if (split) packed_few_avx2(M, sx, w, g0, whole, op);
        else packed_groups_avx2(xp, M, w, g0, whole, op);
      }
      if (g1 > full) {  // the plain rows at the end
        if (split && M == 1) m1_rows(t, sx[0], K, w.data, w.row_bytes, full * GROUP, N, op);
        else panel_rows(isa, t, xp, M, K, w.data, w.row_bytes, full * GROUP, N, op, N);
      }
    });
    return;
  }
#endif
  at::parallel_for(0, (N + GROUP - 1) / GROUP, PANEL / GROUP, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * GROUP, n1 = std::min(N, g1 * GROUP);
    std::unique_ptr<uint8_t[]> plain(new uint8_t[(n1 - n0) * w.row_bytes]);
    plain_rows(w.data, true, t, N, w.row_bytes, n0, n1, plain.get());
    panel_rows(isa, t, xp, M, K, plain.get(), w.row_bytes, 0, n1 - n0, op + n0, N);
  });
}

int64_t check_weight(const at::Tensor& w, int64_t t, int64_t N, int64_t K) {
  const Layout L = layout_of(t & TYPE_MASK);
  TORCH_CHECK(L.block > 0 && (!(t & PACKED) || packable(t & TYPE_MASK)), "prefill_quant: unsupported GGUF type ", t);
  TORCH_CHECK(K > 0 && K % L.block == 0, "prefill_quant: K = ", K, " is not a multiple of the block size ", L.block);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.device().is_cpu(),
              "prefill_quant: the weight must be contiguous uint8 blocks on the CPU");
  const int64_t row_bytes = K / L.block * L.bytes;
  TORCH_CHECK(w.numel() == N * row_bytes, "prefill_quant: weight holds ", w.numel(), " bytes, [", N, ", ", K,
              "] needs ", N * row_bytes);
  return row_bytes;
}

at::Tensor dequant_matrix(const QMatrix& w) {
  at::Tensor y = at::empty({w.N, w.K}, at::TensorOptions().dtype(at::kFloat));
  float* yp = y.data_ptr<float>();
  const int isa = g_isa.load();
  const int64_t t = w.type & TYPE_MASK;
  at::parallel_for(0, (w.N + GROUP - 1) / GROUP, PANEL / GROUP, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * GROUP, n1 = std::min(w.N, g1 * GROUP);
    std::unique_ptr<uint8_t[]> plain;
    const uint8_t* rows = w.data + n0 * w.row_bytes;
    if (w.type & PACKED) {
      plain.reset(new uint8_t[(n1 - n0) * w.row_bytes]);
      plain_rows(w.data, true, t, w.N, w.row_bytes, n0, n1, plain.get());
      rows = plain.get();
    }
    dequant_rows(isa, t, rows, w.row_bytes, n1 - n0, w.K, yp + n0 * w.K);
  });
  return y;
}

at::Tensor pack(const at::Tensor& w, int64_t t, int64_t N, int64_t K) {
  const int64_t row_bytes = check_weight(w, t, N, K);
  TORCH_CHECK(packable(t), "prefill_quant: only Q4_0, Q4_1 and Q8_0 blocks pack (type ", t, ")");
  at::Tensor out = w.clone();
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int bytes = layout_of(t).bytes;
  at::parallel_for(0, N / GROUP, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++)
      pack_group(src + g * GROUP * row_bytes, row_bytes, bytes, dst + g * GROUP * row_bytes);
  });
  return out;
}

at::Tensor dequant(const at::Tensor& w, int64_t t, int64_t N, int64_t K) {
  const int64_t row_bytes = check_weight(w, t, N, K);
  return dequant_matrix({w.data_ptr<uint8_t>(), t, N, K, row_bytes});
}

at::Tensor gemm(const at::Tensor& x_in, const at::Tensor& w, int64_t t, int64_t N, int64_t K) {
  const int64_t row_bytes = check_weight(w, t, N, K);
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == K && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "prefill_quant: x must be float32 [M, ", K, "] on the CPU");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  matmul(x.data_ptr<float>(), x.size(0), {w.data_ptr<uint8_t>(), t, N, K, row_bytes}, out.data_ptr<float>());
  return out;
}

}  // namespace

int current_isa() { return g_isa.load(); }

QMatrix qmatrix(const at::Tensor& w, int64_t t) {
  const Layout L = layout_of(t & TYPE_MASK);
  TORCH_CHECK(L.block > 0, "prefill_quant: unsupported GGUF type ", t);
  TORCH_CHECK(w.dim() == 2 && w.size(1) % L.bytes == 0, "prefill_quant: blocks must be [N, row_bytes]");
  const int64_t N = w.size(0), K = w.size(1) / L.bytes * L.block;
  check_weight(w, t, N, K);
  return {w.data_ptr<uint8_t>(), t, N, K, w.size(1)};
}

void matmul(const float* xp, int64_t M, const QMatrix& w_in, float* op) {
  const int64_t N = w_in.N, K = w_in.K;
  if (M == 0) return;
  if ((w_in.type & ACT_Q8) && packable(w_in.type & TYPE_MASK) && matmul_q8(xp, M, w_in, op)) return;
  const QMatrix w{w_in.data, w_in.type & ~ACT_Q8, N, K, w_in.row_bytes};  // the float32-activation path
  const int isa = g_isa.load();
  if (w.type & PACKED) return matmul_packed(isa, xp, M, w, op);
  if (matmul_kquant(xp, M, w, op)) return;
#if defined(__x86_64__) || defined(_M_X64)
  if (M == 1 && isa >= AVX2 && packable(w.type)) {
    const int64_t nb = K / 32;
    std::unique_ptr<int16_t[]> hl(new int16_t[2 * K]);  // [2, K]
    std::unique_ptr<float[]> sums(new float[2 * nb]);   // [2, K / 32]
    const avx2::SplitX sx{hl.get(), hl.get() + K, sums.get(), sums.get() + nb};
    if (avx2::split_x(xp, K, sx)) {
      at::parallel_for(0, N, PANEL, [&](int64_t n0, int64_t n1) {
        m1_rows(w.type, sx, K, w.data, w.row_bytes, n0, n1, op);
      });
      return;
    }
  }
#endif
  at::parallel_for(0, N, PANEL, [&](int64_t n0, int64_t n1) {
    panel_rows(isa, w.type, xp, M, K, w.data, w.row_bytes, n0, n1, op, N);
  });
}

namespace {

std::string set_isa(const std::string& name) {
  const int best = best_isa();
  if (name == "auto") {
    g_isa = best;
  } else if (name == "scalar") {
    g_isa = SCALAR;
  } else if (name == "avx2") {
    TORCH_CHECK(best >= AVX2, "prefill_quant: this CPU has no AVX2 + FMA + F16C");
    g_isa = AVX2;
  } else if (name == "avx512") {
    TORCH_CHECK(best >= AVX512, "prefill_quant: this CPU has no AVX-512 F + BW + VL + VNNI");
    g_isa = AVX512;
  } else {
    TORCH_CHECK(false, "prefill_quant: unknown isa '", name, "' (auto, avx512, avx2, scalar)");
  }
  return isa_name(g_isa.load());
}

}  // namespace
}  // namespace prefill_quant

TORCH_LIBRARY(prefill_quant, m) {
  m.def("gemm(Tensor x, Tensor w, int qtype, int n, int k) -> Tensor");
  m.def("pre_attention(Tensor x, Tensor norm_w, float eps, Tensor[] w, int[] qtypes, Tensor? bias, Tensor cos, "
        "Tensor sin, int H_q, int H_kv, Tensor? q_norm, Tensor? k_norm) -> (Tensor, Tensor, Tensor)");
  m.def("post_attention(Tensor x, Tensor o, Tensor w_o, int o_type, Tensor norm_w, float eps, Tensor w_gate_up, "
        "int gate_up_type, Tensor w_down, int down_type, Tensor? post_attn_norm, Tensor? post_mlp_norm, "
        "bool gelu) -> Tensor");
  m.def("decode_block(Tensor x, Tensor norm1, float eps, Tensor[] w_qkv, int[] qkv_types, Tensor? bias, Tensor cos, "
        "Tensor sin, int H_q, int H_kv, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor slots, Tensor table, "
        "Tensor first_block, Tensor first, Tensor end, int block_size, float scale, Tensor w_o, int o_type, "
        "Tensor norm2, Tensor w_gate_up, int gate_up_type, Tensor w_down, int down_type, Tensor? q_norm, "
        "Tensor? k_norm, Tensor? post_attn_norm, Tensor? post_mlp_norm, bool gelu) -> Tensor");
  m.def("dequant(Tensor w, int qtype, int n, int k) -> Tensor");
  m.def("pack(Tensor w, int qtype, int n, int k) -> Tensor");
  m.def("set_isa(str isa) -> str", &prefill_quant::set_isa);  // no tensors: one kernel for every backend
  m.def("isa() -> str", [] { return std::string(prefill_quant::isa_name(prefill_quant::current_isa())); });
}

TORCH_LIBRARY_IMPL(prefill_quant, CPU, m) {
  m.impl("gemm", &prefill_quant::gemm);
  m.impl("dequant", &prefill_quant::dequant);
  m.impl("pack", &prefill_quant::pack);
}
