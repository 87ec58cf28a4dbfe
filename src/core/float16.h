// float -> bfloat16 / float16 bits, round to nearest even (NaN stays NaN): the CPU's
// conversions for image normalisation and for pad values of 16-bit float fields.
//
// Thread safety: pure functions.
#ifndef FEEDLINE_SRC_CORE_FLOAT16_H_
#define FEEDLINE_SRC_CORE_FLOAT16_H_

#include <cstdint>

namespace feedline {

uint16_t FloatToBFloat16(float f);
uint16_t FloatToHalf(float f);

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_FLOAT16_H_
