#include "core/float16.h"

#include <cstring>

namespace feedline {

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7FFF + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}

uint16_t FloatToHalf(float f) {
#if defined(__FLT16_MANT_DIG__)
  // _Float16 conversion is IEEE round-to-nearest-even (F16C when the target has it).
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
#else
  // Compilers without _Float16 on this target (clang 14 on x86-64): the same rounding in
  // software (round to nearest even; overflow to infinity; subnormals; NaN stays NaN).
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs >= 0x7F800000) return uint16_t(sign | 0x7C00 | (abs > 0x7F800000 ? 0x200 : 0));
  if (abs >= 0x477FF000) return uint16_t(sign | 0x7C00);  // rounds to infinity
  if (abs < 0x38800000) {                                 // subnormal half (or zero)
    const uint32_t shift = 126 - (abs >> 23);
    if (shift > 25) return uint16_t(sign);
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t dropped = shift;  // half = mantissa (24 bits) * 2^(exponent - 126)
    uint32_t half = mant >> dropped;
    const uint32_t rem = mant & ((1u << dropped) - 1);
    const uint32_t mid = 1u << (dropped - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = ((abs - 0x38000000) >> 13);
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return uint16_t(sign | half);
#endif
}

}  // namespace feedline
