// Paged attention over the KV pool, read in place: every query of a forward (a decode row's one query, or in
// deterministic mode every query of a prefill chunk) attends to positions [first, end) of its sequence through
// its block table, in the pool's blocks, with an online softmax over blocks of block_size keys.
//
// Each query's keys are visited in the same order, block by block at fixed positions, in spans whose bounds depend
// only on its own positions (a long row's spans run on different threads and are merged by log-sum-exp), whatever
// the other queries of the call, the block table's layout or the thread count: so a query's output is bitwise the
// same alone, in a batch, or in a chunk of any size (the batch-invariant mode). The K/V of a KV head are read once for
// its G query heads (GQA), and nothing is copied out of the pool.
//
//   q      [R, H_q, D] float32, contiguous        out [R, H_q, D] float32
//   k, v   [H_kv, n_slots, D] float32, bfloat16 or float16, D contiguous (the pool's per-layer tensors; 16-bit K/V
//          are widened to float32 as they are read, exactly, and every sum runs in float32), or uint8
//          [H_kv, n_slots, D / 32 * 34] of q8_0 rows (prefill.model.kv_quant): a block of keys is dequantized
//          (q * d, exact in float32) into a buffer as it is read, then read as float32
//   table  [R, T] int64: block ids; table[r][j] holds positions (j + first_block[r]) * bs ...
//   first_block, first, end  [R] int64: the table's first block; the first and one-past-last positions read
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PA_HAVE_X86 1
#endif

namespace {

constexpr int64_t kMaxBlock = 64;  // block_size bound (the pool uses 16)
constexpr int64_t kMaxG = 16;      // query heads per KV head bound
constexpr int64_t kSpan = 512;     // positions per span of a long row (see spans_of)
constexpr int64_t kMaxSpans = 8;
constexpr int64_t kAhead = 2;     // blocks between the one read and the one prefetched

using bf16_t = uint16_t;  // a bfloat16's bits: the top half of a float32's
struct f16_t {             // an IEEE float16's bits (a type of its own, so the loads below overload on it)
  uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(bf16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float to_float(f16_t x) { return c10::detail::fp16_ieee_to_fp32_value(x.bits); }

// n q8_0 rows of D values (34 bytes per 32: a float16 d, 32 int8 q) as float32 q * d, exact: the same values
// on every path.
void dequant_q8_0_scalar(const uint8_t* src, int64_t n, int64_t D, float* dst) {
  for (int64_t b = 0; b < n * D / 32; b++, src += 34, dst += 32) {
    uint16_t h;
    std::memcpy(&h, src, sizeof h);
    const float d = c10::detail::fp16_ieee_to_fp32_value(h);
    for (int i = 0; i < 32; i++) dst[i] = static_cast<float>(static_cast<int8_t>(src[2 + i])) * d;
  }
}

// How many spans a row of n positions is read in: the spans of one (row, KV head) run on different threads, so
// one long row keeps every thread busy (one row has H_kv = 3 work items for 2 threads otherwise), and their
// partial softmaxes are merged by log-sum-exp. A function of n alone: a query's spans, and so its result, are
// the same alone, in a batch, or in a chunk of any size.
int64_t spans_of(int64_t n) { return std::clamp<int64_t>(n / kSpan, 1, kMaxSpans); }

// The scalar path: any CPU, the same visiting order as the AVX2 one (results may differ in the last bits
// between the two paths, never within one).
template <typename T>
void query_block_scalar(const float* q, int64_t G, int64_t D, const T* kb, const T* vb, int64_t n, float scale,
                        float* m, float* l, float* acc) {
  float s[kMaxBlock];
  for (int64_t g = 0; g < G; g++) {
    const float* qg = q + g * D;
    float mx = m[g];
    for (int64_t t = 0; t < n; t++) {
      float d = 0.f;
      for (int64_t i = 0; i < D; i++) d += qg[i] * to_float(kb[t * D + i]);
      s[t] = d * scale;
      mx = s[t] > mx ? s[t] : mx;
    }
    const float corr = std::exp(m[g] - mx);
    float sum = l[g] * corr;
    float* a = acc + g * D;
    for (int64_t i = 0; i < D; i++) a[i] *= corr;
    for (int64_t t = 0; t < n; t++) {
      const float p = std::exp(s[t] - mx);
      sum += p;
      for (int64_t i = 0; i < D; i++) a[i] += p * to_float(vb[t * D + i]);
    }
    m[g] = mx;
    l[g] = sum;
  }
}

#ifdef PA_HAVE_X86
// exp(x) for 8 lanes (Cephes' single-precision polynomial, about 1 ulp); x <= 0 here, -inf gives 0.
PA_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f), log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f);
  const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, log2e, half));
  x = _mm256_fnmadd_ps(fx, c1, x);
  x = _mm256_fnmadd_ps(fx, c2, x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, half);
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, one));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_mask, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// 8 elements of K or V as float32 (a bfloat16's bits shifted into a float32's top half).
PA_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
PA_AVX2 inline __m256 load8(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
PA_AVX2 inline __m256 load8(const f16_t* p) {  // F16C: 8 float16s widened, exactly
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The dot product of one query and one key from its 8 lane sums, in a fixed order: ((0+1)+(2+3))+((4+5)+(6+7)),
// the order the four-key reduction below produces, so a score does not depend on which path computed it.
PA_AVX2 inline float lane_sum(__m256 d) {
  alignas(32) float a[8];
  _mm256_store_ps(a, d);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Scores s[g][t] = scale * q_g.k_t of n keys for NG query heads at once: each key is loaded once for the NG heads,
// four keys at a time, 4 * NG independent FMA chains, each key's 8 lane sums reduced by one hadd tree per head.
// kn (or null): the K of a block ahead, prefetched a group of keys at a time.
template <typename T, int NG>
PA_AVX2 void scores_avx2(const float* q, int64_t D, const T* kb, int64_t n, float scale, float (*s)[kMaxBlock],
                         const char* kn) {
  int64_t t = 0;
  const __m128 vs = _mm_set1_ps(scale);
  for (; t + 4 <= n; t += 4) {
    __m256 d[NG][4];
    for (int g = 0; g < NG; g++)
      for (int j = 0; j < 4; j++) d[g][j] = _mm256_setzero_ps();
    const T* k0 = kb + t * D;
    constexpr int64_t e = sizeof(T);
    if (kn)
      for (int64_t o = 0; o < 4 * D * e; o += 64) _mm_prefetch(kn + t * D * e + o, _MM_HINT_T0);
    for (int64_t i = 0; i < D; i += 8) {
      __m256 qv[NG];
      for (int g = 0; g < NG; g++) qv[g] = _mm256_loadu_ps(q + g * D + i);
      for (int j = 0; j < 4; j++) {
        const __m256 kv = load8(k0 + j * D + i);
        for (int g = 0; g < NG; g++) d[g][j] = _mm256_fmadd_ps(qv[g], kv, d[g][j]);
      }
    }
    for (int g = 0; g < NG; g++) {
      // hadd(hadd(d0, d1), hadd(d2, d3)) = [d0..d3 of lanes 0-3 | d0..d3 of lanes 4-7]
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(d[g][0], d[g][1]), _mm256_hadd_ps(d[g][2], d[g][3]));
      const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(s[g] + t, _mm_mul_ps(r, vs));
    }
  }
  for (; t < n; t++)
    for (int g = 0; g < NG; g++) {
      __m256 d = _mm256_setzero_ps();
      for (int64_t i = 0; i < D; i += 8)
        d = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + i), load8(kb + t * D + i), d);
      s[g][t] = lane_sum(d) * scale;
    }
}

// acc_g[0, D) = acc_g * corr_g + sum_t p_g[t] v_t for NG heads, 32 floats of D at a time: each V row is loaded once
// for the NG heads, 4 * NG accumulators (each element's terms added in the order of t, as in the scalar path);
// vn (or null): the V of a block ahead, prefetched a row at a time.
template <typename T, int NG>
PA_AVX2 void values_avx2(float* acc, int64_t D, const float* corr, const float (*p)[kMaxBlock], const T* vb,
                         int64_t n, const char* vn) {
  constexpr int64_t e = sizeof(T);
  for (int64_t i = 0; i < D; i += 32) {
    if (i + 32 <= D) {
      __m256 x[NG][4];
      for (int g = 0; g < NG; g++) {
        const __m256 vc = _mm256_set1_ps(corr[g]);
        for (int j = 0; j < 4; j++) x[g][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + g * D + i + 8 * j), vc);
      }
      for (int64_t t = 0; t < n; t++) {
        const T* vt = vb + t * D + i;
        if (vn) {  // this row's 32 elements of the V ahead (128 bytes of float32, 64 of 16-bit)
          _mm_prefetch(vn + (t * D + i) * e, _MM_HINT_T0);
          if (e == 4) _mm_prefetch(vn + (t * D + i) * e + 64, _MM_HINT_T0);
        }
        __m256 pt[NG];
        for (int g = 0; g < NG; g++) pt[g] = _mm256_broadcast_ss(p[g] + t);
        for (int j = 0; j < 4; j++) {
          const __m256 v = load8(vt + 8 * j);
          for (int g = 0; g < NG; g++) x[g][j] = _mm256_fmadd_ps(pt[g], v, x[g][j]);
        }
      }
      for (int g = 0; g < NG; g++)
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(acc + g * D + i + 8 * j, x[g][j]);
    } else {  // the last 8, 16 or 24 floats of D
      for (int g = 0; g < NG; g++)
        for (int64_t f = i; f < D; f += 8) {
          __m256 x = _mm256_mul_ps(_mm256_loadu_ps(acc + g * D + f), _mm256_set1_ps(corr[g]));
          for (int64_t t = 0; t < n; t++) x = _mm256_fmadd_ps(_mm256_set1_ps(p[g][t]), load8(vb + t * D + f), x);
          _mm256_storeu_ps(acc + g * D + f, x);
        }
    }
  }
}

// One block of n keys for NG query heads of one KV head (D a multiple of 8): scores, the online softmax's update
// of each head's (m, l), then the weighted values.
template <typename T, int NG>
PA_AVX2 void heads_block_avx2(const float* q, int64_t D, const T* kb, const T* vb, int64_t n, float scale, float* m,
                              float* l, float* acc, const char* kn, const char* vn) {
  alignas(32) float s[NG][kMaxBlock];
  float corr[NG];
  scores_avx2<T, NG>(q, D, kb, n, scale, s, kn);
  const int64_t n8 = (n + 7) / 8 * 8;
  for (int g = 0; g < NG; g++) {
    for (int64_t t = n; t < n8; t++) s[g][t] = -INFINITY;
    const __m256 m_old = _mm256_set1_ps(m[g]);
    __m256 vmx = m_old;
    for (int64_t t = 0; t < n8; t += 8) vmx = _mm256_max_ps(vmx, _mm256_load_ps(s[g] + t));
    vmx = _mm256_max_ps(vmx, _mm256_permute2f128_ps(vmx, vmx, 1));  // the max in every lane, in registers
    vmx = _mm256_max_ps(vmx, _mm256_shuffle_ps(vmx, vmx, 0x4E));
    vmx = _mm256_max_ps(vmx, _mm256_shuffle_ps(vmx, vmx, 0xB1));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < n8; t += 8) {
      const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(s[g] + t), vmx));
      _mm256_store_ps(s[g] + t, p);
      sum = _mm256_add_ps(sum, p);
    }
    const __m256 c = exp8(_mm256_sub_ps(m_old, vmx));  // m = -inf (nothing seen yet) gives 0
    corr[g] = _mm256_cvtss_f32(c);
    m[g] = _mm256_cvtss_f32(vmx);
    l[g] = l[g] * corr[g] + lane_sum(sum);
  }
  values_avx2<T, NG>(acc, D, corr, s, vb, n, vn);
}

// One block of n keys for the G query heads of one KV head, in groups of up to three heads (three keep the
// accumulators of four keys, or of 32 floats of D, in AVX2's sixteen registers).
template <typename T>
PA_AVX2 void query_block_avx2(const float* q, int64_t G, int64_t D, const T* kb, const T* vb, int64_t n, float scale,
                              float* m, float* l, float* acc, const char* kn, const char* vn) {
  for (int64_t g = 0; g < G;) {
    const int64_t ng = std::min<int64_t>(3, G - g);
    const auto heads = ng == 3 ? heads_block_avx2<T, 3> : ng == 2 ? heads_block_avx2<T, 2> : heads_block_avx2<T, 1>;
    // the block ahead is prefetched once, by the first group
    heads(q + g * D, D, kb, vb, n, scale, m + g, l + g, acc + g * D, g == 0 ? kn : nullptr, g == 0 ? vn : nullptr);
    g += ng;
  }
}

PA_AVX2 void dequant_q8_0_avx2(const uint8_t* src, int64_t n, int64_t D, float* dst) {
  for (int64_t b = 0; b < n * D / 32; b++, src += 34, dst += 32) {
    uint16_t h;
    std::memcpy(&h, src, sizeof h);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    for (int j = 0; j < 4; j++) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 2 + 8 * j));
      _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
    }
  }
}

bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#else
bool cpu_has_avx2() { return false; }
#endif

// One block of n q8_0 keys and values (rows of rb / block_size bytes): dequantized into kf, vf [n, D] (exact), then
// read as float32 keys and values; kn, vn (or null): the block ahead's rb bytes of K and of V, prefetched first.
void query_block_q8(bool simd, const float* q, int64_t G, int64_t D, const uint8_t* kb, const uint8_t* vb, int64_t n,
                    float scale, float* m, float* l, float* acc, const char* kn, const char* vn, int64_t rb, float* kf,
                    float* vf) {
#ifdef PA_HAVE_X86
  if (simd) {
    if (kn)
      for (int64_t o = 0; o < rb; o += 64) _mm_prefetch(kn + o, _MM_HINT_T0), _mm_prefetch(vn + o, _MM_HINT_T0);
    dequant_q8_0_avx2(kb, n, D, kf);
    dequant_q8_0_avx2(vb, n, D, vf);
    query_block_avx2<float>(q, G, D, kf, vf, n, scale, m, l, acc, nullptr, nullptr);
    return;
  }
#endif
  dequant_q8_0_scalar(kb, n, D, kf);
  dequant_q8_0_scalar(vb, n, D, vf);
  query_block_scalar<float>(q, G, D, kf, vf, n, scale, m, l, acc);
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                           const at::Tensor& first_block, const at::Tensor& first, const at::Tensor& end,
                           int64_t block_size, double scale, bool allow_simd) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be [R, H_q, D] float32");
  const auto kt = k.scalar_type();
  const int64_t D = q.size(2), rs = kt == at::kByte ? D / 32 * 34 : D;  // a slot's elements: D values, or q8_0 bytes
  TORCH_CHECK(k.dim() == 3 && (kt == at::kFloat || kt == at::kBFloat16 || kt == at::kHalf || kt == at::kByte) &&
                  k.stride(2) == 1 && k.stride(1) == k.size(2) && k.size(2) == rs && (kt != at::kByte || D % 32 == 0),
              "k must be [H_kv, n_slots, D] float32, bfloat16 or float16 with D contiguous, or q8_0 rows uint8 "
              "[H_kv, n_slots, D / 32 * 34] (D a multiple of 32)");
  TORCH_CHECK(v.sizes() == k.sizes() && v.strides() == k.strides() && v.scalar_type() == k.scalar_type(), "v like k");
  TORCH_CHECK(block_size >= 1 && block_size <= kMaxBlock, "block_size must be in [1, 64]");
  const int64_t R = q.size(0), H_q = q.size(1), H_kv = k.size(0), n_slots = k.size(1);
  TORCH_CHECK(H_q % H_kv == 0 && H_q / H_kv <= kMaxG, "head counts or widths do not fit");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == R && table.scalar_type() == at::kLong, "table must be [R, T] long");
  const int64_t G = H_q / H_kv, T = table.size(1);
  auto out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const int64_t* tp = table.data_ptr<int64_t>();
  const int64_t *fb = first_block.data_ptr<int64_t>(), *fp = first.data_ptr<int64_t>(), *ep = end.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t khs = k.stride(0);
  const bool simd = allow_simd && cpu_has_avx2() && D % 8 == 0;
  const float sc = static_cast<float>(scale);
  // Work items: each (row, KV head) over each span of the row's positions; partial (m, l, acc) per item.
  struct Item {
    int64_t r, h, lo, hi;
  };
  std::vector<Item> items;
  std::vector<int64_t> first_item(R * H_kv + 1);
  for (int64_t r = 0; r < R; r++) {
    const int64_t n = std::max<int64_t>(ep[r] - fp[r], 0), spans = spans_of(n), width = (n + spans - 1) / std::max<int64_t>(spans, 1);
    for (int64_t h = 0; h < H_kv; h++) {
      first_item[r * H_kv + h] = static_cast<int64_t>(items.size());
      for (int64_t s = 0; s < spans; s++)
        items.push_back({r, h, fp[r] + s * width, std::min(ep[r], fp[r] + (s + 1) * width)});
    }
  }
  first_item[R * H_kv] = static_cast<int64_t>(items.size());
  const int64_t stride = G * D + 2 * G;  // one item's partial: acc [G, D], m [G], l [G]
  std::vector<float> part(items.size() * stride);
  // Every item over K/V of element type E (float, or a 16-bit type's bits).
  const auto run = [&](const auto* kp, const auto* vp) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(kp)>>;
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> buf(std::is_same_v<E, uint8_t> ? 2 * kMaxBlock * D : 0);  // q8_0: a block of K, of V
      float *kf = buf.data(), *vf = kf + (buf.empty() ? 0 : kMaxBlock * D);
      for (int64_t w = lo; w < hi; w++) {
        const int64_t r = items[w].r, h = items[w].h;
        float* acc = part.data() + w * stride;
        float *m = acc + G * D, *l = m + G;
        std::fill(acc, acc + G * D, 0.f);
        for (int64_t g = 0; g < G; g++) m[g] = -INFINITY, l[g] = 0.f;
        const float* qrh = qp + (r * H_q + h * G) * D;
        for (int64_t pos = items[w].lo; pos < items[w].hi;) {
          const int64_t j = pos / block_size - fb[r];
          TORCH_CHECK(j >= 0 && j < T, "position outside the block table");
          const int64_t stop = std::min(items[w].hi, (pos / block_size + 1) * block_size);
          const int64_t slot = tp[r * T + j] * block_size + pos % block_size;
          TORCH_CHECK(slot >= 0 && slot + (stop - pos) <= n_slots, "block id outside the pool");
          const E* kb = kp + h * khs + slot * rs;
          const E* vb = vp + h * khs + slot * rs;
          // The K and V of the block two ahead in the table, fetched a few lines at a time while this one computes
          // (each block is a 4 KB page of K and one of V: the hardware prefetcher stops at every page's end, and
          // a whole block's prefetches issued at once stall on the miss buffers). 1 thread, S = 4,096, 30 layers:
          // 9.4 GB/s read, against 6.4 without.
          const char *kn = nullptr, *vn = nullptr;
          if (j + kAhead < T && stop + kAhead * block_size <= items[w].hi) {
            const int64_t ahead = tp[r * T + j + kAhead] * block_size;
            if (ahead >= 0 && ahead + block_size <= n_slots) {
              kn = reinterpret_cast<const char*>(kp + h * khs + ahead * rs);
              vn = reinterpret_cast<const char*>(vp + h * khs + ahead * rs);
            }
          }
          if constexpr (std::is_same_v<E, uint8_t>)
            query_block_q8(simd, qrh, G, D, kb, vb, stop - pos, sc, m, l, acc, kn, vn, block_size * rs, kf, vf);
#ifdef PA_HAVE_X86
          else if (simd)
            query_block_avx2<E>(qrh, G, D, kb, vb, stop - pos, sc, m, l, acc, kn, vn);
#endif
          else
            query_block_scalar<E>(qrh, G, D, kb, vb, stop - pos, sc, m, l, acc);
          pos = stop;
        }
      }
    });
  };
  if (kt == at::kBFloat16)
    run(reinterpret_cast<const bf16_t*>(k.data_ptr<at::BFloat16>()),
        reinterpret_cast<const bf16_t*>(v.data_ptr<at::BFloat16>()));
  else if (kt == at::kHalf)
    run(reinterpret_cast<const f16_t*>(k.data_ptr<at::Half>()), reinterpret_cast<const f16_t*>(v.data_ptr<at::Half>()));
  else if (kt == at::kByte)
    run(k.data_ptr<uint8_t>(), v.data_ptr<uint8_t>());
  else
    run(k.data_ptr<float>(), v.data_ptr<float>());
  // Each (row, KV head): its spans' partials merged in span order by their log-sum-exp, then normalised.
  std::vector<float> merged(G * D + 2 * G);
  for (int64_t rh = 0; rh < R * H_kv; rh++) {
    const int64_t r = rh / H_kv, h = rh % H_kv, i0 = first_item[rh], n_items = first_item[rh + 1] - i0;
    const float* acc = part.data() + i0 * stride;
    if (n_items > 1) {  // one span is the partial itself
      float* a = merged.data();
      float *m = a + G * D, *l = m + G;
      for (int64_t g = 0; g < G; g++) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < n_items; s++) mx = std::max(mx, part[(i0 + s) * stride + G * D + g]);
        l[g] = 0.f;
        std::fill(a + g * D, a + (g + 1) * D, 0.f);
        for (int64_t s = 0; s < n_items; s++) {
          const float* ps = part.data() + (i0 + s) * stride;
          const float ms = ps[G * D + g], c = std::isinf(ms) ? 0.f : std::exp(ms - mx);
          l[g] += ps[G * D + G + g] * c;
          for (int64_t i = 0; i < D; i++) a[g * D + i] += ps[g * D + i] * c;
        }
      }
      acc = a;
    }
    const float* l = acc + G * D + G;
    for (int64_t g = 0; g < G; g++) {
      float* o = op + (r * H_q + h * G + g) * D;
      const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
      for (int64_t i = 0; i < D; i++) o[i] = acc[g * D + i] * inv;
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(prefill_kernels, m) {
  m.def("paged_attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor first_block, Tensor first, Tensor end, "
        "int block_size, float scale, bool allow_simd) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(paged_attention));
}
