// Independent reference for float16/bfloat16 used by the kernel tests. Decoding uses ldexp on the
// bit fields; rounding searches the sorted table of representable values for the two neighbours of
// x and picks the nearer (ties: even bit pattern). Nothing here shares code with half.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace nezha::testing {

struct SmallFloatFormat {
  int exponent_bits;
  int mantissa_bits;
};
constexpr SmallFloatFormat kHalfFormat{5, 10};
constexpr SmallFloatFormat kBFloat16Format{8, 7};

inline double decode_small_float(uint16_t bits, SmallFloatFormat fmt) {
  const int bias = (1 << (fmt.exponent_bits - 1)) - 1;
  const int exp_all_ones = (1 << fmt.exponent_bits) - 1;
  const bool negative = bits >> 15;
  const int exponent = (bits >> fmt.mantissa_bits) & exp_all_ones;
  const int mantissa = bits & ((1 << fmt.mantissa_bits) - 1);
  double magnitude;
  if (exponent == exp_all_ones) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, 1 - bias - fmt.mantissa_bits);
  } else {
    magnitude = std::ldexp(mantissa + (1 << fmt.mantissa_bits), exponent - bias - fmt.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

class SmallFloatRounder {
 public:
  explicit SmallFloatRounder(SmallFloatFormat fmt) : fmt_(fmt) {
    const uint16_t inf_bits = static_cast<uint16_t>(((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits);
    for (uint32_t b = 0; b < inf_bits; ++b) values_.push_back(decode_small_float(b, fmt));
    // Treat infinity as the next value of the binade above the largest finite one: overflow then
    // rounds exactly like IEEE (values from max + half an ulp upwards become inf).
    const int bias = (1 << (fmt.exponent_bits - 1)) - 1;
    values_.push_back(std::ldexp(1.0, bias + 1));
    inf_bits_ = inf_bits;
  }

  // Bits of x rounded to nearest even; NaN returns any NaN pattern (callers compare with isnan).
  uint16_t round(double x) const {
    if (std::isnan(x)) return static_cast<uint16_t>(inf_bits_ | 1);
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    if (a >= values_.back()) return sign | inf_bits_;
    const auto hi = std::upper_bound(values_.begin(), values_.end(), a);
    const size_t hi_bits = static_cast<size_t>(hi - values_.begin());
    const size_t lo_bits = hi_bits - 1;
    const double below = a - values_[lo_bits];
    const double above = values_[hi_bits] - a;
    size_t pick = below < above ? lo_bits : above < below ? hi_bits : (lo_bits % 2 == 0 ? lo_bits : hi_bits);
    return static_cast<uint16_t>(sign | pick);
  }

 private:
  SmallFloatFormat fmt_;
  std::vector<double> values_;  // values_[bits] for every non-negative finite pattern, then "inf"
  uint16_t inf_bits_;
};

}  // namespace nezha::testing
