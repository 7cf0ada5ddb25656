// Numbers written for people: in messages, logs and the examples' summaries.
#pragma once

#include <cstdint>
#include <string>

namespace mt {

// 1234567 -> "1,234,567"; -1234 -> "-1,234".
std::string with_commas(int64_t n);

}  // namespace mt
