// kiln C++ kernel prelude: scalar helpers with PyTorch's semantics (NaN, signed zero,
// integer division by zero) that the compiler can still vectorize.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

// glibc's vector math library provides SIMD versions of these; declaring them lets the
// compiler vectorize loops that call them without -ffast-math (which would break NaN/inf).
extern "C" {
#define KILN_SIMD __attribute__((simd("notinbranch")))
KILN_SIMD float expf(float); KILN_SIMD float logf(float); KILN_SIMD float sinf(float);
KILN_SIMD float cosf(float); KILN_SIMD float tanhf(float); KILN_SIMD float expm1f(float);
KILN_SIMD float log1pf(float); KILN_SIMD float erff(float); KILN_SIMD float powf(float, float);
KILN_SIMD float exp2f(float); KILN_SIMD float log2f(float); KILN_SIMD float log10f(float);
KILN_SIMD float tanf(float); KILN_SIMD float atanf(float); KILN_SIMD float erfcf(float);
KILN_SIMD double exp(double); KILN_SIMD double log(double); KILN_SIMD double tanh(double);
}

static inline float kiln_from_bf16(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; std::memcpy(&f, &u, 4); return f; }
// Round to nearest, ties to even; every NaN becomes 0x7fc0, as eager's conversion. Both are
// selects over 32-bit lanes, without a branch: a vector loop then needs no blend per lane.
static inline uint32_t kiln_bf16_rounded_bits(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return f != f ? 0x7fc00000u : r;
}
static inline uint16_t kiln_to_bf16(float f) { return (uint16_t)(kiln_bf16_rounded_bits(f) >> 16); }
static inline float kiln_round_bf16(float f) {
  uint32_t r = kiln_bf16_rounded_bits(f); float o; std::memcpy(&o, &r, 4); return o;
}
static inline uint16_t kiln_bf16_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }
static inline float kiln_round_f16(float f) { return (float)(_Float16)f; }

// A transposing kernel's tile: dst[j * 16 + i] = src[i * stride + j] for i < rows, j < cols.
// src's rows are read whole, so that the kernel's vector loop reads dst contiguously instead
// of gathering an element from each of the tile's lines.
template <typename T>
static inline void kiln_transpose_tile(const T* src, int64_t stride, T* dst, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * 16 + i] = src[i * stride + j];
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// A tile in registers: the scalar copy's scattered stores cost several times the copy.
// Four rounds of shuffles: 2x2 blocks of 32-bit lanes, 4x4 blocks, then 128-bit lanes twice.
static inline void kiln_transpose_16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}
// An edge tile's missing rows and columns are zeros in registers and never read.
static inline void kiln_transpose_tile(const float* src, int64_t stride, float* dst, int64_t rows, int64_t cols) {
  __m512 r[16];
  const __mmask16 lanes = (__mmask16)((1u << cols) - 1u);
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(lanes, src + i * stride) : _mm512_setzero_ps();
  kiln_transpose_16x16(r);
  for (int i = 0; i < 16; ++i) _mm512_store_ps(dst + i * 16, r[i]);
}
static inline void kiln_transpose_tile(const int32_t* src, int64_t stride, int32_t* dst, int64_t rows, int64_t cols) {
  kiln_transpose_tile((const float*)src, stride, (float*)dst, rows, cols);
}
// bf16 and 16-bit integers, widened to 32-bit lanes and narrowed back.
static inline void kiln_transpose_tile(const uint16_t* src, int64_t stride, uint16_t* dst, int64_t rows, int64_t cols) {
  __m512 r[16];
  const __mmask16 lanes = (__mmask16)((1u << cols) - 1u);
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_castsi512_ps(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, src + i * stride)))
                    : _mm512_setzero_ps();
  kiln_transpose_16x16(r);
  for (int i = 0; i < 16; ++i) _mm256_store_si256((__m256i*)(dst + i * 16), _mm512_cvtepi32_epi16(_mm512_castps_si512(r[i])));
}
#endif

// NaN if either is NaN, else the first operand on ties (-0.0 vs 0.0), as eager. The comparison
// is made whatever the operands: one made only for numbers may trap, and g++ then keeps the
// loop scalar. `b > a ? b : a` is one vector max instruction (it yields a when either is NaN),
// so only b's NaN needs a select.
template <typename T> static inline T kiln_maximum(T a, T b) {
  T larger = b > a ? b : a;
  return (b != b) ? b : larger;
}
template <typename T> static inline T kiln_minimum(T a, T b) {
  T smaller = b < a ? b : a;
  return (b != b) ? b : smaller;
}

// Integer division as eager computes it. Divisors 0 and -1 never reach a division: by 0 it
// traps (the host raises; the kernel's result is 0), and the smallest int64 by -1 overflows
// and traps, where eager returns the smallest integer again (its negation, wrapped).
static inline int64_t kiln_negate_wrapped(int64_t a) { return (int64_t)(0 - (uint64_t)a); }
static inline int64_t kiln_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return kiln_negate_wrapped(a);
  int64_t q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> static inline T kiln_floordiv_fp(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  T fl;
  if (div != 0) { fl = std::floor(div); if (div - fl > T(0.5)) fl += 1; }
  else fl = std::copysign(T(0), a / b);
  return fl;
}
static inline int64_t kiln_truncdiv(int64_t a, int64_t b) {
  return b == 0 ? 0 : (b == -1 ? kiln_negate_wrapped(a) : a / b);
}
static inline int64_t kiln_remainder(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T kiln_remainder_fp(T a, T b) {
  T r = std::fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t kiln_fmod(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline int64_t kiln_pow(int64_t a, int64_t b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  int64_t r = 1;
  while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
  return r;
}
template <typename T> static inline T kiln_sign(T a) { return (T)((a > 0) - (a < 0)); }  // sign(NaN) == 0 in eager
template <typename T> static inline T kiln_sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
static inline float kiln_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }
// erf as eager's vectorized GELU computes it (Abramowitz and Stegun 7.1.26; within 5e-7 of
// erf, and no relative accuracy near 0, so only GELU uses it, where 1 + erf absorbs that):
// sign(x) * (1 - r(t) * t * exp(-x * x)), t = 1 / (1 + p * |x|), cheaper than glibc's vector
// erff.
static inline float kiln_gelu_erf(float x) {
  float t = 1.0f / fmaf(0.3275911f, fabsf(x), 1.0f);
  float r = fmaf(fmaf(fmaf(fmaf(1.061405429f, t, -1.453152027f), t, 1.421413741f), t, -0.284496736f), t,
                 0.254829592f);
  float y = fmaf(-expf(-(x * x)) * t, r, 1.0f);
  return copysignf(y, x);
}
// GELU's erf form, computed as eager does
template <typename T> static inline T kiln_gelu(T a) { return a * T(0.5) * (T(1) + std::erf(a * T(0.70710678118654752440))); }
static inline float kiln_gelu(float a) { return a * 0.5f * (1.0f + kiln_gelu_erf(a * 0.70710678118654752440f)); }
// Shifts by the bit width or more (or by a negative amount) are defined as in eager, not UB.
template <typename T> static inline T kiln_lshift(T a, T b) {
  typedef typename std::make_unsigned<T>::type U;
  return ((U)b >= sizeof(T) * 8) ? T(0) : (T)((U)a << (U)b);
}
template <typename T> static inline T kiln_rshift(T a, T b) {
  typedef typename std::make_signed<T>::type S;
  const int bits = sizeof(T) * 8;
  return ((S)b < 0 || (int64_t)b >= bits) ? (T)(a >> (bits - 1)) : (T)(a >> b);
}
// Philox4x32-10 as Triton's tl.rand/tl.randn compute it (kiln/ir/philox.py): key = the seed's
// halves, counter = (offset's low half, its high half, 0, 0); the same seed and offset give
// the same float on the CPU and the GPU. Plain integer code, so loops over it vectorize.
static inline void kiln_philox(int64_t seed, int64_t offset, uint32_t& w0, uint32_t& w1) {
  uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p2 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p2 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p2; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  w0 = c0; w1 = c1;
}
// int32 x < 0 folds to -x - 1 (== ~x, with no overflow), then times the scale: [0, 1)
static inline float kiln_word_to_uniform(uint32_t w) {
  int32_t x = (int32_t)w;
  return (float)(x < 0 ? ~x : x) * 4.6566127342e-10f;
}
static inline float kiln_philox_uniform(int64_t seed, int64_t offset) {
  uint32_t w0, w1; kiln_philox(seed, offset, w0, w1); return kiln_word_to_uniform(w0);
}
static inline float kiln_philox_normal(int64_t seed, int64_t offset) {
  uint32_t w0, w1; kiln_philox(seed, offset, w0, w1);
  float u1 = kiln_word_to_uniform(w0), u2 = kiln_word_to_uniform(w1);
  u1 = u1 < 1.0e-7f ? 1.0e-7f : u1;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}
