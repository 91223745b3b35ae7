// scale(): multiply every element by a factor (the engine's prescale/postscale, e.g. 1/size for
// Average), with Horovod's arithmetic per dtype (its CPU ScaleBuffer): float32 and float64 in their
// own type, float16 and bfloat16 in float32, integers in double and truncated toward zero.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "collectives/half_convert.h"
#include "collectives/reduce.h"
#include "common/error.h"

namespace nezha::collectives {
namespace {

// Horovod's rule, so scaled results match it bit for bit: a tensor is multiplied in its own type,
// the factor first rounded to that type (float32 x float(factor), float64 x factor).
template <typename T>
void scale_floating(T* __restrict buf, size_t n, double factor) {
  const T f = static_cast<T>(factor);
  for (size_t i = 0; i < n; ++i) buf[i] *= f;
}

void scale_via_float(uint16_t* buf, size_t n, double factor, const HalfArrayConverters& cvt) {
  constexpr size_t kChunk = 512;
  const float f = static_cast<float>(factor);
  float tmp[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = std::min(kChunk, n - base);
    cvt.widen(buf + base, tmp, m);
    for (size_t i = 0; i < m; ++i) tmp[i] *= f;
    cvt.narrow(tmp, buf + base, m);
  }
}

// Integers: computed in double, rounded toward zero, saturated to T's range (an out-of-range
// double -> integer conversion would be undefined behaviour).
template <typename T>
void scale_integer(T* __restrict buf, size_t n, double factor) {
  constexpr double kLow = static_cast<double>(std::numeric_limits<T>::min());
  // 2^(value bits): the first double above T's range, exact even for int64 (unlike double(max)).
  constexpr double kHighExclusive = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
  for (size_t i = 0; i < n; ++i) {
    const double v = std::trunc(static_cast<double>(buf[i]) * factor);
    buf[i] = v < kLow                ? std::numeric_limits<T>::min()
             : v >= kHighExclusive   ? std::numeric_limits<T>::max()
                                     : static_cast<T>(v);
  }
}

}  // namespace

void scale(void* buf, size_t count, DataType dtype, double factor) {
  if (!is_valid_dtype(static_cast<int>(dtype))) {
    throw InvalidArgument("scale: unknown dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (factor == 1.0) return;
  if (dtype == DataType::kBool) {
    throw InvalidArgument("scale: bool tensors cannot be scaled (factor " +
                          std::to_string(factor) + "); use Sum/Min/Max, not Average");
  }
  if (!is_floating(dtype) && !std::isfinite(factor)) {
    throw InvalidArgument(std::string("scale: non-finite factor for integer dtype ") +
                          dtype_name(dtype));
  }
  switch (dtype) {
    case DataType::kUInt8: return scale_integer(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt8: return scale_integer(static_cast<int8_t*>(buf), count, factor);
    case DataType::kInt16: return scale_integer(static_cast<int16_t*>(buf), count, factor);
    case DataType::kUInt16: return scale_integer(static_cast<uint16_t*>(buf), count, factor);
    case DataType::kInt32: return scale_integer(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64: return scale_integer(static_cast<int64_t*>(buf), count, factor);
    case DataType::kFloat32: return scale_floating(static_cast<float*>(buf), count, factor);
    case DataType::kFloat64: return scale_floating(static_cast<double*>(buf), count, factor);
    case DataType::kFloat16:
      return scale_via_float(static_cast<uint16_t*>(buf), count, factor, float16_converters());
    case DataType::kBFloat16:
      return scale_via_float(static_cast<uint16_t*>(buf), count, factor, bfloat16_converters());
    case DataType::kBool:
      break;  // rejected above
  }
}

}  // namespace nezha::collectives
