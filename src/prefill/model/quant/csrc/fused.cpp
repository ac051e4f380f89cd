// A decoder block's work around attention as two operators, so a decode step pays one dispatch for each
// instead of ~12 small torch ops (each ~5 us on this CPU, as much as a whole GEMM of the layer):
//
//   pre_attention(x [B, P, D], norm_w, eps, w_qkv[], types[], bias?, cos, sin [B, P, 1, d], H_q, H_kv, q_norm?,
//       k_norm?) -> q, k, v: RMSNorm, the fused Q/K/V product (+ bias), RMSNorm of each Q and K head (Qwen3,
//       Gemma 3), rotary on the Q and K heads
//   post_attention(x [M, D], o [M, H_q d], w_o, o_type, norm_w, eps, w_gate_up, gu_type, w_down, down_type,
//       post_attn_norm?, post_mlp_norm?, gelu) -> [M, D]: x + o W_o^T (its RMSNorm first where the family has
//       one), then RMSNorm, gate/up product, silu(gate) * up (or GELU-tanh), down product (its RMSNorm), residual
//   decode_block(x [N, D], ..., k_pool, v_pool, slots, table, first_block, first, end, block_size, scale, ...)
//       -> [N, D]: a whole block for N decode rows: the work before attention, K/V stored in the pool, paged
//       attention over each row's blocks (prefill_kernels::paged_attention), the work after. One dispatch a
//       layer: the Python between those steps cost more than the layer's GEMMs (7 ms a step of 30 layers).
//
// Q/K/V come as one matrix of blocks or as parts of different types (a Q4_K_M file's Q, K, V: Q5_0, Q5_0, Q8_0;
// rows of blocks fuse only within one type), each multiplied into its columns of one [M, N] product.
//
// The same arithmetic as prefill.model.transformer's qkv_rotary and out_and_mlp, every family's block: the
// optional norms and the gate's activation are arguments (each norm the same RMSNorm row kernel).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "elementwise.h"
#include "gemm.h"

namespace prefill_quant {
namespace {

constexpr int64_t ROW_GRAIN_ELEMENTS = 16384;  // elementwise rows split over threads in chunks of about this

int64_t row_grain(int64_t width) { return std::max<int64_t>(1, ROW_GRAIN_ELEMENTS / std::max<int64_t>(1, width)); }

const float* norm_weight(const at::Tensor& w, int64_t K) {
  TORCH_CHECK(w.numel() == K && w.scalar_type() == at::kFloat && w.is_contiguous(), "prefill_quant: norm weight");
  return w.data_ptr<float>();
}

const float* norm_weight(const c10::optional<at::Tensor>& w, int64_t K) {
  return w.has_value() ? norm_weight(*w, K) : nullptr;
}

// y = RMSNorm(x) over M rows of K (y may be x: each row is read whole before it is written).
void rmsnorm(const float* x, int64_t M, int64_t K, const float* w, double eps, float* y) {
  at::parallel_for(0, M, row_grain(K), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) rmsnorm_row(x + m * K, K, w, (float)eps, y + m * K);
  });
}

// The Q/K/V weight: one matrix of blocks, or parts of different types stacked by rows (N = their sum).
struct QRows {
  std::vector<QMatrix> parts;
  int64_t N = 0, K = 0;
};

QRows qrows(at::TensorList ws, at::IntArrayRef types) {
  TORCH_CHECK(!ws.empty() && ws.size() == types.size(), "prefill_quant: give each Q/K/V part one type");
  QRows r;
  for (size_t i = 0; i < ws.size(); i++) {
    r.parts.push_back(qmatrix(ws[i], types[i]));
    TORCH_CHECK(r.parts[i].K == r.parts[0].K, "prefill_quant: Q/K/V parts of different widths");
    r.N += r.parts[i].N;
  }
  r.K = r.parts[0].K;
  return r;
}

// out [M, N] = x [M, K] times each part's rows, into its columns.
void matmul_rows(const float* x, int64_t M, const QRows& w, float* out) {
  if (w.parts.size() == 1) return matmul(x, M, w.parts[0], out);
  int64_t col = 0;
  for (const QMatrix& p : w.parts) {
    if (M == 1) {
      matmul(x, 1, p, out + col);
    } else {
      std::unique_ptr<float[]> part(new float[M * p.N]);  // [M, N_part]
      matmul(x, M, p, part.get());
      for (int64_t m = 0; m < M; m++) std::memcpy(out + m * w.N + col, part.get() + m * p.N, p.N * sizeof(float));
    }
    col += p.N;
  }
}

at::Tensor check_rows(const at::Tensor& t, int64_t width, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.size(1) == width && t.scalar_type() == at::kFloat && t.device().is_cpu(),
              "prefill_quant: ", what, " must be float32 [M, ", width, "] on the CPU");
  return t.contiguous();
}

// Each head's RMSNorm (q_norm on the H_q query heads, k_norm on the next H_kv) over one row of width-d heads.
void head_norms(float* row, int64_t H_q, int64_t H_kv, int64_t d, const float* q_norm, const float* k_norm,
                double eps) {
  for (int64_t h = 0; h < H_q + H_kv; h++, row += d) rmsnorm_row(row, d, h < H_q ? q_norm : k_norm, (float)eps, row);
}

at::Tensor qkv_rotary_rows(const at::Tensor& x_in, const at::Tensor& norm_w, double eps, at::TensorList w,
                           at::IntArrayRef types, const c10::optional<at::Tensor>& bias, const at::Tensor& cos_in,
                           const at::Tensor& sin_in, int64_t H_q, int64_t H_kv,
                           const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm) {
  const QRows W = qrows(w, types);
  const at::Tensor x = check_rows(x_in, W.K, "x");
  const int64_t M = x.size(0), N = W.N, d = cos_in.size(-1), rotary_heads = H_q + H_kv;
  const at::Tensor cos = check_rows(cos_in, d, "cos"), sin = check_rows(sin_in, d, "sin");
  TORCH_CHECK(cos.size(0) == M && sin.size(0) == M && rotary_heads * d <= N && d % 2 == 0,
              "prefill_quant: rotary tables must be [M, d_head] with (H_q + H_kv) d_head <= N");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "prefill_quant: q_norm and k_norm come together");
  const float *qn = norm_weight(q_norm, d), *kn = norm_weight(k_norm, d);
  at::Tensor h = at::empty({M, W.K}, x.options());  // [M, D]: the normed activations
  rmsnorm(x.data_ptr<float>(), M, W.K, norm_weight(norm_w, W.K), eps, h.data_ptr<float>());
  at::Tensor out = at::empty({M, N}, x.options());  // [M, (H_q + 2 H_kv) d_head]
  float* op = out.data_ptr<float>();
  matmul_rows(h.data_ptr<float>(), M, W, op);
  const float* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kFloat && bias->is_contiguous(), "prefill_quant: bias");
    bp = bias->data_ptr<float>();
  }
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, M, row_grain(N), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      float* row = op + m * N;
      if (bp)
        for (int64_t n = 0; n < N; n++) row[n] += bp[n];
      if (qn) head_norms(row, H_q, H_kv, d, qn, kn, eps);
      rotary_row(row, rotary_heads, d, cp + m * d, sp + m * d);
    }
  });
  return out;
}

// x [B, P, D], cos / sin [B, P, 1, d_head] -> q [B, H_q, P, d_head], k and v [B, H_kv, P, d_head], each
// contiguous, as prefill.model.transformer.qkv_rotary returns them (there, views of one buffer).
std::tuple<at::Tensor, at::Tensor, at::Tensor> pre_attention(
    const at::Tensor& x, const at::Tensor& norm_w, double eps, at::TensorList w, at::IntArrayRef types,
    const c10::optional<at::Tensor>& bias, const at::Tensor& cos, const at::Tensor& sin, int64_t H_q, int64_t H_kv,
    const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm) {
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 4, "prefill_quant: x must be [B, P, D] and cos [B, P, 1, d_head]");
  const int64_t B = x.size(0), P = x.size(1), D = x.size(2), d = cos.size(-1), H = H_q + 2 * H_kv;
  const at::Tensor qkv = qkv_rotary_rows(x.reshape({B * P, D}), norm_w, eps, w, types, bias, cos.reshape({B * P, d}),
                                         sin.reshape({B * P, d}), H_q, H_kv, q_norm, k_norm);
  TORCH_CHECK(qkv.size(1) == H * d, "prefill_quant: the Q/K/V weight has ", qkv.size(1), " rows, not ", H * d);
  at::Tensor q = at::empty({B, H_q, P, d}, x.options()), k = at::empty({B, H_kv, P, d}, x.options()),
             v = at::empty({B, H_kv, P, d}, x.options());
  const float* src = qkv.data_ptr<float>();  // [B, P, H, d]
  float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  at::parallel_for(0, B * P, row_grain(H * d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t b = r / P, p = r % P;
      for (int64_t h = 0; h < H; h++) {
        float* dst = h < H_q          ? qp + ((b * H_q + h) * P + p) * d
                     : h < H_q + H_kv ? kp + ((b * H_kv + h - H_q) * P + p) * d
                                      : vp + ((b * H_kv + h - H_q - H_kv) * P + p) * d;
        std::memcpy(dst, src + (r * H + h) * d, d * sizeof(float));
      }
    }
  });
  return {q, k, v};
}

// g [M, F] = act(gate) * up of gu [M, gate | up]: SiLU, or GELU-tanh (`gelu`).
void gate_mul(const float* gu, int64_t M, int64_t F, bool gelu, float* g) {
  const int isa = current_isa();
  at::parallel_for(0, M, row_grain(F), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      const float* row = gu + m * 2 * F;  // [gate | up]
#if defined(__x86_64__) || defined(_M_X64)
      if (isa >= AVX2) {
        (gelu ? gelu_mul_row_avx2 : silu_mul_row_avx2)(row, row + F, F, g + m * F);
        continue;
      }
#endif
      (gelu ? gelu_mul_row_scalar : silu_mul_row_scalar)(row, row + F, F, g + m * F);
    }
  });
}

void add_into(float* y, const float* x, int64_t n) {
  at::parallel_for(0, n, ROW_GRAIN_ELEMENTS, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) y[i] = x[i] + y[i];
  });
}

at::Tensor post_attention(const at::Tensor& x_in, const at::Tensor& o_in, const at::Tensor& w_o, int64_t o_type,
                          const at::Tensor& norm_w, double eps, const at::Tensor& w_gu, int64_t gu_type,
                          const at::Tensor& w_down, int64_t down_type, const c10::optional<at::Tensor>& post_attn_norm,
                          const c10::optional<at::Tensor>& post_mlp_norm, bool gelu) {
  const QMatrix Wo = qmatrix(w_o, o_type), Wgu = qmatrix(w_gu, gu_type), Wd = qmatrix(w_down, down_type);
  const int64_t D = Wo.N, F = Wgu.N / 2;
  TORCH_CHECK(Wgu.K == D && Wd.K == F && Wd.N == D && Wgu.N % 2 == 0, "prefill_quant: block weight shapes");
  const float *post_attn = norm_weight(post_attn_norm, D), *post_mlp = norm_weight(post_mlp_norm, D);
  const at::Tensor x = check_rows(x_in, D, "x"), o = check_rows(o_in, Wo.K, "o");
  const int64_t M = x.size(0);
  TORCH_CHECK(o.size(0) == M, "prefill_quant: x and o rows differ");
  const auto opts = x.options();
  at::Tensor x1 = at::empty({M, D}, opts);  // x + attention output
  float* x1p = x1.data_ptr<float>();
  matmul(o.data_ptr<float>(), M, Wo, x1p);
  if (post_attn) rmsnorm(x1p, M, D, post_attn, eps, x1p);
  add_into(x1p, x.data_ptr<float>(), M * D);
  at::Tensor h = at::empty({M, D}, opts);
  rmsnorm(x1p, M, D, norm_weight(norm_w, D), eps, h.data_ptr<float>());
  at::Tensor gu = at::empty({M, 2 * F}, opts);  // [M, gate | up]
  matmul(h.data_ptr<float>(), M, Wgu, gu.data_ptr<float>());
  at::Tensor g = at::empty({M, F}, opts);
  gate_mul(gu.data_ptr<float>(), M, F, gelu, g.data_ptr<float>());
  at::Tensor out = at::empty({M, D}, opts);
  float* outp = out.data_ptr<float>();
  matmul(g.data_ptr<float>(), M, Wd, outp);
  if (post_mlp) rmsnorm(outp, M, D, post_mlp, eps, outp);
  add_into(outp, x1p, M * D);
  return out;
}

// The pool's paged attention (model/csrc/paged_attention.cpp, another operator of this library), found once.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                           const at::Tensor& first_block, const at::Tensor& first, const at::Tensor& end,
                           int64_t block_size, double scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("prefill_kernels::paged_attention", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, int64_t, double, bool)>();
  return op.call(q, k, v, table, first_block, first, end, block_size, scale, true);
}

// One row of d values as q8_0 (the arithmetic of prefill.model.kv_quant.quantize, in its order): per block of 32,
// d = max|x| / 127 stored as float16, then q = x * (1 / d) rounded half to even, clamped to +-127.
void quantize_q8_0_row(const float* x, int64_t d, uint8_t* out) {
  for (int64_t b = 0; b < d / 32; b++) {
    const float* xb = x + b * 32;
    uint8_t* o = out + b * 34;
    float amax = 0.f;
    for (int64_t i = 0; i < 32; i++) amax = std::max(amax, std::fabs(xb[i]));
    const float scale = amax / 127.f, inv = scale > 0.f ? 1.f / scale : 0.f;
    const uint16_t h = c10::detail::fp16_ieee_from_fp32_value(scale);
    std::memcpy(o, &h, sizeof h);
    for (int64_t i = 0; i < 32; i++) {
      const float r = std::clamp(std::nearbyint(xb[i] * inv), -127.f, 127.f);
      o[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(r));
    }
  }
}

// Each token's new K and V (heads H_q .. H_q + 2 H_kv of its qkv row [H, d]) into its slot of the pool (rs
// elements a slot), in the pool's element type: a 16-bit type rounds to nearest even, as torch's .to() does (the
// attention path's store); uint8 rows are q8_0 (quantize_q8_0_row).
template <typename T>
void store_kv(const float* src, int64_t N, int64_t H, int64_t H_q, int64_t H_kv, int64_t d, const int64_t* slots,
              T* kp, T* vp, int64_t hs, int64_t rs) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t h = 0; h < H_kv; h++) {
      const float *ks = src + (n * H + H_q + h) * d, *vs = src + (n * H + H_q + H_kv + h) * d;
      T *kd = kp + h * hs + slots[n] * rs, *vd = vp + h * hs + slots[n] * rs;
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(kd, ks, d * sizeof(float));
        std::memcpy(vd, vs, d * sizeof(float));
      } else if constexpr (std::is_same_v<T, uint8_t>) {
        quantize_q8_0_row(ks, d, kd);
        quantize_q8_0_row(vs, d, vd);
      } else {
        for (int64_t i = 0; i < d; i++) kd[i] = T(ks[i]), vd[i] = T(vs[i]);
      }
    }
}

// The same arithmetic, in the same order, as pre_attention, the pool's index_copy_ of K and V, paged_attention
// and post_attention called one after the other (prefill.model.attention.attend for a batch of decode rows):
// the result is bitwise theirs.
at::Tensor decode_block(const at::Tensor& x, const at::Tensor& norm1, double eps, at::TensorList w_qkv,
                        at::IntArrayRef qkv_types, const c10::optional<at::Tensor>& bias, const at::Tensor& cos,
                        const at::Tensor& sin, int64_t H_q, int64_t H_kv, const at::Tensor& k_pool,
                        const at::Tensor& v_pool, const at::Tensor& slots, const at::Tensor& table,
                        const at::Tensor& first_block, const at::Tensor& first, const at::Tensor& end,
                        int64_t block_size, double scale, const at::Tensor& w_o, int64_t o_type,
                        const at::Tensor& norm2, const at::Tensor& w_gu, int64_t gu_type, const at::Tensor& w_down,
                        int64_t down_type, const c10::optional<at::Tensor>& q_norm,
                        const c10::optional<at::Tensor>& k_norm, const c10::optional<at::Tensor>& post_attn_norm,
                        const c10::optional<at::Tensor>& post_mlp_norm, bool gelu) {
  TORCH_CHECK(x.dim() == 2 && cos.dim() == 2, "prefill_quant: x must be [N, D] and cos [N, d_head]");
  const int64_t N = x.size(0), d = cos.size(1), H = H_q + 2 * H_kv;
  const at::Tensor qkv =
      qkv_rotary_rows(x, norm1, eps, w_qkv, qkv_types, bias, cos, sin, H_q, H_kv, q_norm, k_norm);  // [N, H d]
  TORCH_CHECK(qkv.size(1) == H * d, "prefill_quant: the Q/K/V weight has ", qkv.size(1), " rows, not ", H * d);
  const auto kt = k_pool.scalar_type();
  const int64_t rs = kt == at::kByte ? d / 32 * 34 : d;  // a slot's elements: d values, or q8_0 bytes
  TORCH_CHECK(k_pool.dim() == 3 && k_pool.size(0) == H_kv && k_pool.size(2) == rs && k_pool.stride(2) == 1 &&
                  k_pool.stride(1) == rs && (kt != at::kByte || d % 32 == 0) &&
                  (kt == at::kFloat || kt == at::kBFloat16 || kt == at::kHalf || kt == at::kByte) &&
                  v_pool.sizes() == k_pool.sizes() && v_pool.strides() == k_pool.strides() &&
                  v_pool.scalar_type() == kt,
              "prefill_quant: the pool's K and V must be float32, bfloat16, float16 [H_kv, n_slots, d_head] or q8_0 "
              "uint8 [H_kv, n_slots, d_head / 32 * 34], rows contiguous");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == N && slots.scalar_type() == at::kLong && slots.is_contiguous(),
              "prefill_quant: slots must be [N] long");
  const float* src = qkv.data_ptr<float>();  // [N, H, d]: q heads, then k heads, then v heads
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t n_slots = k_pool.size(1), hs = k_pool.stride(0);
  for (int64_t n = 0; n < N; n++)
    TORCH_CHECK(sp[n] >= 0 && sp[n] < n_slots, "prefill_quant: slot ", sp[n], " outside the pool");
  if (kt == at::kFloat)
    store_kv(src, N, H, H_q, H_kv, d, sp, k_pool.data_ptr<float>(), v_pool.data_ptr<float>(), hs, rs);
  else if (kt == at::kBFloat16)
    store_kv(src, N, H, H_q, H_kv, d, sp, k_pool.data_ptr<at::BFloat16>(), v_pool.data_ptr<at::BFloat16>(), hs, rs);
  else if (kt == at::kHalf)
    store_kv(src, N, H, H_q, H_kv, d, sp, k_pool.data_ptr<at::Half>(), v_pool.data_ptr<at::Half>(), hs, rs);
  else
    store_kv(src, N, H, H_q, H_kv, d, sp, k_pool.data_ptr<uint8_t>(), v_pool.data_ptr<uint8_t>(), hs, rs);
  const at::Tensor q = qkv.narrow(1, 0, H_q * d).contiguous().view({N, H_q, d});
  const at::Tensor o = paged_attention(q, k_pool, v_pool, table, first_block, first, end, block_size, scale);
  return post_attention(x, o.view({N, H_q * d}), w_o, o_type, norm2, eps, w_gu, gu_type, w_down, down_type,
                        post_attn_norm, post_mlp_norm, gelu);
}

}  // namespace
}  // namespace prefill_quant

TORCH_LIBRARY_IMPL(prefill_quant, CPU, m) {
  m.impl("pre_attention", &prefill_quant::pre_attention);
  m.impl("post_attention", &prefill_quant::post_attention);
  m.impl("decode_block", &prefill_quant::decode_block);
}
