// The two 8-bit float formats of FP8 training (OCP FP8 / Hopper tensor cores), their exact
// rounding and the power-of-two scales picotrain uses, on the host and on the device (the
// same code: CpuOps' emulation and CudaOps' cast kernels round alike bit for bit).
//
//  - e4m3 ("E4M3FN"): sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; the one
//    NaN pattern is S.1111.111. Largest 448 = 1.75 * 2^8, smallest subnormal 2^-9.
//  - e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is an
//    infinity, S.11111.xx (xx != 0) a NaN. Largest finite 57344 = 1.75 * 2^15, smallest 2^-16.
//
// Encoding (float -> code) rounds to nearest, ties to even, and saturates as the hardware's
// `cvt.rn.satfinite` does: a finite value or an infinity beyond the largest finite value
// becomes that value with its sign; NaN stays NaN. (The satfinite choice matters: a tensor
// scaled by an amax from another micro-batch must not turn into infinities.)
//
// Scales are powers of two: a tensor x is stored as code(x * s) with s = 2^k the largest power
// of two for which amax(x) * s <= the format's largest value. Then multiplying by s and by 1/s
// is exact (away from underflow), so dequantisation (code value * 1/s) and the matmul's
// rescaling of its fp32 sum are exact too, and the CPU emulation can match the GPU bit for bit
// up to the order of the sum. (torchtitan calls this round_scales_to_power_of_2.)
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PT_FP8_FN __host__ __device__ inline
#else
#define PT_FP8_FN inline
#endif

namespace pt {

enum class Fp8Format : uint8_t { e4m3, e5m2 };

inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

// Which largest magnitudes an amax takes over a matrix [rows, cols]: the whole tensor's (one
// scale: the "tensorwise" recipe), each row's, or each column's ("rowwise": one scale per row of
// the K-major operand a product takes, which is a column of the matrix when it goes in transposed).
enum class Fp8Amax : uint8_t { tensor, rows, cols };

PT_FP8_FN uint32_t fp8_float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}
PT_FP8_FN float fp8_bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

PT_FP8_FN int fp8_mantissa_bits(Fp8Format f) { return f == Fp8Format::e4m3 ? 3 : 2; }
PT_FP8_FN int fp8_exponent_bias(Fp8Format f) { return f == Fp8Format::e4m3 ? 7 : 15; }
// The code of the largest finite value (sign bit clear): e4m3 0.1111.110 = 448, e5m2 0.11110.11 = 57344.
PT_FP8_FN uint32_t fp8_max_code(Fp8Format f) { return f == Fp8Format::e4m3 ? 0x7eu : 0x7bu; }
PT_FP8_FN float fp8_max_value(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

// float -> code: round to nearest even, saturating to the largest finite value; NaN -> NaN.
PT_FP8_FN uint8_t fp8_encode(float x, Fp8Format f) {
  const uint32_t bits = fp8_float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN (a NaN in both formats)
  const int m = fp8_mantissa_bits(f), bias = fp8_exponent_bias(f);
  const int shift = 23 - m;
  uint32_t code;
  if (int(mag >> 23) < 127 + 1 - bias) {
    // Below the smallest normal: a multiple of the subnormal quantum 2^(1 - bias - m). The code
    // is that multiple (a carry into the exponent field gives the smallest normal, correctly).
    // |x| / quantum is exact; round it to an integer, ties to even, with integer arithmetic on
    // the float's significand so that host and device agree whatever their rounding modes.
    const int e = int(mag >> 23);  // biased float exponent (0: a float subnormal, far below)
    if (e == 0) return static_cast<uint8_t>(sign);
    const uint64_t significand = (mag & 0x7fffffu) | 0x800000u;  // |x| = significand * 2^(e - 150)
    // |x| / quantum = significand * 2^(e - 150 - (1 - bias - m)) = significand >> rshift
    const int rshift = 150 - e + 1 - bias - m;
    if (rshift >= 26) return static_cast<uint8_t>(sign);  // below half the quantum: 0
    const uint64_t q = significand >> rshift, rem = significand & ((uint64_t(1) << rshift) - 1);
    const uint64_t half = uint64_t(1) << (rshift - 1);
    code = static_cast<uint32_t>(q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0));
  } else {
    // Normal: round the float's exponent+mantissa bits to m mantissa bits (a carry moves into the
    // exponent, as it should), then rebias the exponent.
    const uint32_t rounded = (mag + ((1u << (shift - 1)) - 1) + ((mag >> shift) & 1u)) >> shift;
    const uint32_t rebias = uint32_t(127 - bias) << m;
    code = rounded - rebias;
    if (code > fp8_max_code(f)) code = fp8_max_code(f);  // beyond the range, or an infinity
  }
  return static_cast<uint8_t>(sign | code);
}

// code -> float (exact: every FP8 value is a float).
PT_FP8_FN float fp8_decode(uint8_t code, Fp8Format f) {
  const int m = fp8_mantissa_bits(f), bias = fp8_exponent_bias(f);
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7fu;
  const uint32_t exp = mag >> m, mant = mag & ((1u << m) - 1);
  if (f == Fp8Format::e4m3 && mag == 0x7fu) return fp8_bits_float(sign | 0x7fc00000u);
  if (f == Fp8Format::e5m2 && exp == 31u) return fp8_bits_float(sign | (mant ? 0x7fc00000u : 0x7f800000u));
  if (exp == 0) {  // subnormal: mant * 2^(1 - bias - m), built from an exact float product
    const float quantum = fp8_bits_float(uint32_t(127 + 1 - bias - m) << 23);
    return fp8_bits_float(sign | fp8_float_bits(float(mant) * quantum));
  }
  return fp8_bits_float(sign | ((exp + 127 - bias) << 23) | (mant << (23 - m)));
}

// The exponent k of the scale s = 2^k for a tensor whose largest magnitude is `amax`: the
// largest k with amax * 2^k <= fp8_max_value(f), clamped to [-126, 126] so that s and 1/s are
// normal floats. amax 0 (an all-zero tensor) or not finite gives k = 0 (NaNs stay NaNs; the
// run guard stops a run that made them).
PT_FP8_FN int fp8_scale_exponent(float amax, Fp8Format f) {
  const uint32_t a = fp8_float_bits(amax) & 0x7fffffffu;
  if (a == 0 || a >= 0x7f800000u) return 0;
  // amax = ma * 2^ea (ma in [1, 2); a float subnormal counts as 2^-126 and below), max = 1.75 * 2^em.
  int ea = int(a >> 23) - 127;
  uint32_t mant = a & 0x7fffffu;
  if (ea == -127) {  // float subnormal: normalise
    ea = -126;
    while (!(mant & 0x800000u)) mant <<= 1, ea--;
    mant &= 0x7fffffu;
  }
  const int em = f == Fp8Format::e4m3 ? 8 : 15;
  // max / amax = (1.75 / ma) * 2^(em - ea); 1.75 / ma >= 1 exactly when ma <= 1.75 (mantissa bits 0x600000).
  int k = em - ea - (mant > 0x600000u ? 1 : 0);
  if (k > 126) k = 126;
  if (k < -126) k = -126;
  return k;
}

PT_FP8_FN float fp8_pow2(int k) { return fp8_bits_float(uint32_t(127 + k) << 23); }  // k in [-126, 127]

// |x| as the bits of a non-negative float: integer order is value order (NaNs above infinity),
// so a max over them is exact, order-free, and a NaN wins.
PT_FP8_FN uint32_t fp8_magnitude_bits(float x) { return fp8_float_bits(x) & 0x7fffffffu; }

// The scale exponent of scale i when n_amax ranks each hold a part of what it covers: from the
// largest of amaxes[r * stride + i], r < n_amax (the whole tensor's: stride 1, i 0; per-row
// scales: stride = the rows), compared as bits.
PT_FP8_FN int fp8_parts_scale_exponent(const float* amaxes, int n_amax, size_t stride, size_t i, Fp8Format f) {
  uint32_t largest = 0;
  for (int r = 0; r < n_amax; r++) {
    const uint32_t m = fp8_magnitude_bits(amaxes[size_t(r) * stride + i]);
    largest = m > largest ? m : largest;
  }
  return fp8_scale_exponent(fp8_bits_float(largest), f);
}

}  // namespace pt
