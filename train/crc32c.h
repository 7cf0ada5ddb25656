// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord files frame their records.
//
// crc32c() is the plain checksum (crc32c("123456789") == 0xE3069283); crc32c_extend() continues one
// over more bytes, so crc32c_extend(crc32c(a), b) == crc32c(a + b). A TFRecord stores the masked form,
// masked_crc32c(), which rotates and offsets the checksum so that a CRC of data that itself holds
// CRCs does not degenerate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mt::train {

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }
inline uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

// ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32.
constexpr uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
constexpr uint32_t unmask_crc32c(uint32_t masked) {
  const uint32_t rotated = masked - 0xa282ead8u;
  return (rotated >> 17) | (rotated << 15);
}
inline uint32_t masked_crc32c(const void* data, size_t n) { return mask_crc32c(crc32c(data, n)); }

}  // namespace mt::train
