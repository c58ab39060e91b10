// The parts of rotary position embedding (Ops::rope_forward) that both backends must compute
// identically: the inverse frequencies, and the shape rule. Header-only so the CUDA library,
// which links no core code, uses the same float arithmetic as CpuOps.
#pragma once
#include <cmath>
#include <string>

namespace pt {

// inv_freq_i = 1 / theta^(2i / HS), i < HS/2, in float as Hugging Face's Llama builds it:
// `1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))` is a float division for the
// exponent, a float pow and a float reciprocal. Matching that rounding (rather than computing in
// double) keeps the angles, and so a checkpoint's behaviour, the same as in transformers.
inline float rope_inv_freq(int i, int HS, float theta) {
  return 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(HS));
}

// Empty when (B, T, row_width, rot_heads, HS, theta) describe a valid rope call, else what is
// wrong: the rotated heads must fit in the row and a head must split into two equal halves.
inline std::string rope_shape_error(int B, int T, int row_width, int rot_heads, int HS, float theta) {
  auto n = [](long long v) { return std::to_string(v); };
  if (B < 0 || T < 0 || row_width < 0 || rot_heads < 0)
    return "negative dimension (B=" + n(B) + ", T=" + n(T) + ", row_width=" + n(row_width) +
           ", rot_heads=" + n(rot_heads) + ")";
  if (HS <= 0 || HS % 2 != 0) return "head size HS=" + n(HS) + " must be positive and even (rotate-half pairs)";
  if (static_cast<long long>(rot_heads) * HS > row_width)
    return "rot_heads=" + n(rot_heads) + " heads of HS=" + n(HS) + " do not fit in a row of " + n(row_width);
  if (!(theta > 0.0f)) return "theta=" + std::to_string(theta) + " must be positive";
  return {};
}

}  // namespace pt
