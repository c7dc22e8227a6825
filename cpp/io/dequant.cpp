// Dequantization of ggml block formats to fp32, transcribed from the reference
// (scalar) dequantize_row_* functions of ggml-quants.c; block layouts from ggml-common.h.
#include <cstring>

#include "io/gguf.h"

namespace socllm {
namespace {

constexpr int64_t QK = 32;     // elements per legacy block (Q4_0 ... Q8_0)
constexpr int64_t QK_K = 256;  // elements per K-quant super-block

float fp16_to_fp32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_fp32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float half_at(const uint8_t* p) { return fp16_to_fp32(u16(p)); }

// Q4_0: d (f16), qs[16]; x = (q - 8) * d, low nibbles first.
void deq_q4_0(const uint8_t* b, float* y) {
  float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + QK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}
// Q4_1: d, m (f16), qs[16]; x = q * d + m.
void deq_q4_1(const uint8_t* b, float* y) {
  float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + QK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}
// Q5_0: d, qh[4] (fifth bits), qs[16]; x = (q - 16) * d.
void deq_q5_0(const uint8_t* b, float* y) {
  float d = half_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < QK / 2; ++j) {
    uint8_t xh0 = ((qh >> j) << 4) & 0x10;
    uint8_t xh1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
    y[j + QK / 2] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
  }
}
// Q5_1: d, m, qh[4], qs[16]; x = q * d + m.
void deq_q5_1(const uint8_t* b, float* y) {
  float d = half_at(b), m = half_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < QK / 2; ++j) {
    uint8_t xh0 = ((qh >> j) << 4) & 0x10;
    uint8_t xh1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>((qs[j] & 0x0F) | xh0) * d + m;
    y[j + QK / 2] = static_cast<float>((qs[j] >> 4) | xh1) * d + m;
  }
}
// Q8_0: d, qs[32] int8; x = q * d.
void deq_q8_0(const uint8_t* b, float* y) {
  float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// 6-bit scale/min pairs packed in 12 bytes (ggml-quants.c get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q2_K: scales[16], qs[64], d, dmin.
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  float d = half_at(b + 80), dmin = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < QK_K; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      uint8_t sc = scales[is++];
      float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l] >> shift) & 3) - ml;
      sc = scales[is++];
      dl = d * (sc & 0xF);
      ml = dmin * (sc >> 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l + 16] >> shift) & 3) - ml;
      shift += 2;
    }
    q += 32;
  }
}
// Q3_K: hmask[32], qs[64], scales[12] (6-bit, offset 32), d.
void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  float d_all = half_at(b + 108);
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  uint8_t m = 1;
  int is = 0;
  for (int n = 0; n < QK_K; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      float dl = d_all * (scales[is++] - 32);
      for (int l = 0; l < 16; ++l)
        *y++ = dl * (static_cast<int8_t>((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      dl = d_all * (scales[is++] - 32);
      for (int l = 0; l < 16; ++l)
        *y++ = dl * (static_cast<int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
      shift += 2;
      m <<= 1;
    }
    q += 32;
  }
}
// Q4_K: d, dmin, scales[12], qs[128].
void deq_q4_k(const uint8_t* b, float* y) {
  float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int j = 0; j < QK_K; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}
// Q5_K: d, dmin, scales[12], qh[32], qs[128].
void deq_q5_k(const uint8_t* b, float* y) {
  float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < QK_K; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}
// Q6_K: ql[128], qh[64], scales[16] int8, d.
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = half_at(b + 208);
  for (int n = 0; n < QK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      int is = l / 16;
      int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

struct TypeTraits {
  uint32_t id;
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
  void (*block)(const uint8_t*, float*);  // nullptr: plain element type handled inline
};

constexpr TypeTraits kTypes[] = {
    {0, "F32", 1, 4, nullptr},         {1, "F16", 1, 2, nullptr},
    {2, "Q4_0", QK, 18, deq_q4_0},     {3, "Q4_1", QK, 20, deq_q4_1},
    {6, "Q5_0", QK, 22, deq_q5_0},     {7, "Q5_1", QK, 24, deq_q5_1},
    {8, "Q8_0", QK, 34, deq_q8_0},     {10, "Q2_K", QK_K, 84, deq_q2_k},
    {11, "Q3_K", QK_K, 110, deq_q3_k}, {12, "Q4_K", QK_K, 144, deq_q4_k},
    {13, "Q5_K", QK_K, 176, deq_q5_k}, {14, "Q6_K", QK_K, 210, deq_q6_k},
    {30, "BF16", 1, 2, nullptr},
};

const TypeTraits* find_type(uint32_t type) {
  for (const auto& t : kTypes)
    if (t.id == type) return &t;
  return nullptr;
}

const TypeTraits& require_type(uint32_t type, const char* fn) {
  const TypeTraits* t = find_type(type);
  if (!t)
    throw Unsupported(std::string("[") + fn + "] ggml tensor type " + ggml_type_name(type) +
                      " has no dequantizer");
  return *t;
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  // Names of ggml types socllm cannot decode, so messages still say what the file holds.
  static const std::pair<uint32_t, const char*> kOther[] = {
      {9, "Q8_1"},   {15, "Q8_K"},   {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"},
      {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"},   {22, "IQ2_S"},  {23, "IQ4_XS"},
      {24, "I8"},    {25, "I16"},    {26, "I32"},     {27, "I64"},    {28, "F64"},
      {29, "IQ1_M"}, {34, "TQ1_0"},  {35, "TQ2_0"},   {39, "MXFP4"}};
  if (const TypeTraits* t = find_type(type)) return t->name;
  for (const auto& [id, name] : kOther)
    if (id == type) return name;
  return "type" + std::to_string(type);
}

int64_t ggml_block_elems(uint32_t type) {
  return require_type(type, "ggml_block_elems").block_elems;
}
int64_t ggml_block_bytes(uint32_t type) {
  return require_type(type, "ggml_block_bytes").block_bytes;
}

std::vector<std::string> ggml_supported_types() {
  std::vector<std::string> out;
  for (const auto& t : kTypes) out.emplace_back(t.name);
  return out;
}

void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n) {
  const TypeTraits& t = require_type(type, "dequantize_row");
  if (n < 0 || n % t.block_elems != 0)
    throw ShapeError("[dequantize_row] " + std::to_string(n) + " elements is not a multiple of " +
                     t.name + "'s block of " + std::to_string(t.block_elems));
  switch (type) {
    case 0: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case 1:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(u16(src + 2 * i));
      return;
    case 30:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(u16(src + 2 * i));
      return;
    default:
      for (int64_t b = 0; b < n / t.block_elems; ++b)
        t.block(src + b * t.block_bytes, dst + b * t.block_elems);
  }
}

}  // namespace socllm
