// GGUF block formats (ggml's layouts, type numbers as in ggml.h) and their portable scalar dequantization.
//
// A quantized weight matrix [N, K] is N rows of K / block_size blocks, stored row after row exactly as in the
// file. Every function here decodes whole blocks into float32; the SIMD paths in gemm_avx2.h must agree with
// them (tests compare both against the gguf package's own numpy dequantization).
#pragma once

#include <cstdint>
#include <cstring>

namespace prefill_quant {

enum QType : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };

struct Layout {
  int block;  // weights per block
  int bytes;  // bytes per block
};

constexpr Layout layout_of(int64_t t) {
  switch (t) {
    case Q4_0: return {32, 18};   // f16 d, 16 bytes of nibbles: w = (q - 8) d
    case Q4_1: return {32, 20};   // f16 d, f16 m, 16 bytes of nibbles: w = q d + m
    case Q5_0: return {32, 22};   // f16 d, 32 fifth bits, 16 bytes of nibbles: w = (q - 16) d
    case Q5_1: return {32, 24};   // f16 d, f16 m, 32 fifth bits, 16 bytes of nibbles: w = q d + m
    case Q8_0: return {32, 34};   // f16 d, 32 int8: w = q d
    case Q4_K: return {256, 144}; // f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
    case Q6_K: return {256, 210}; // 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, f16 d
    default: return {0, 0};
  }
}

// IEEE half -> float without F16C (subnormals, infinities and NaN kept).
inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; exp--; }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// Byte i of a 32-weight nibble block holds weight i (low nibble) and weight i + 16 (high nibble).
inline void dequant_block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int i = 0; i < 16; i++) {
    y[i] = (float)((b[2 + i] & 0xf) - 8) * d;
    y[i + 16] = (float)((b[2 + i] >> 4) - 8) * d;
  }
}

inline void dequant_block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int i = 0; i < 16; i++) {
    y[i] = (float)(b[4 + i] & 0xf) * d + m;
    y[i + 16] = (float)(b[4 + i] >> 4) * d + m;
  }
}

// Q5: weight i's fifth bit is bit i of the 32-bit word after the scales (the nibbles as in Q4).
inline void dequant_block_q5(const uint8_t* b, bool offset, float* y) {
  const float d = half_at(b), m = offset ? half_at(b + 2) : 0.0f;
  const uint8_t* p = b + (offset ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const int shift = offset ? 0 : 16;
  for (int i = 0; i < 16; i++) {
    const int q0 = (int)((p[4 + i] & 0xf) | (((qh >> i) & 1) << 4)) - shift;
    const int q1 = (int)((p[4 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - shift;
    y[i] = offset ? (float)q0 * d + m : (float)q0 * d;
    y[i + 16] = offset ? (float)q1 * d + m : (float)q1 * d;
  }
}

inline void dequant_block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; i++) y[i] = (float)q[i] * d;
}

// Q4_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in 12 bytes.
inline void scale_min_k4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

inline void dequant_block_q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int g = 0; g < 4; g++) {  // 64 weights per group of 32 bytes: low nibbles then high nibbles
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * g, scales, &sc1, &m1);
    scale_min_k4(2 * g + 1, scales, &sc2, &m2);
    const float d1 = d * (float)sc1, dm1 = dmin * (float)m1, d2 = d * (float)sc2, dm2 = dmin * (float)m2;
    for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xf) - dm1;
    for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)(q[l] >> 4) - dm2;
    q += 32;
    y += 64;
  }
}

inline void dequant_block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int half = 0; half < 2; half++) {  // 128 weights from 64 low-nibble bytes and 32 high-bit bytes
    for (int l = 0; l < 32; l++) {
      const int is = l / 16;
      const int q1 = (int)((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[is] * (float)q1;
      y[l + 32] = d * (float)sc[is + 2] * (float)q2;
      y[l + 64] = d * (float)sc[is + 4] * (float)q3;
      y[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// One row of K weights (K / block blocks) into y[K].
inline void dequant_row_scalar(int64_t t, const uint8_t* row, int64_t K, float* y) {
  const Layout L = layout_of(t);
  for (int64_t k = 0; k < K; k += L.block, row += L.bytes, y += L.block) {
    switch (t) {
      case Q4_0: dequant_block_q4_0(row, y); break;
      case Q4_1: dequant_block_q4_1(row, y); break;
      case Q5_0: dequant_block_q5(row, false, y); break;
      case Q5_1: dequant_block_q5(row, true, y); break;
      case Q8_0: dequant_block_q8_0(row, y); break;
      case Q4_K: dequant_block_q4_k(row, y); break;
      case Q6_K: dequant_block_q6_k(row, y); break;
    }
  }
}

}  // namespace prefill_quant
