// CRC-32C (Castagnoli), the checksum of every checkpoint shard tensor.
// SSE4.2 instruction when the CPU has it, a slicing-by-8 table otherwise;
// both give the same value (RFC 3720 polynomial 0x82F63B78).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain {

// Continue a CRC over `n` more bytes; start with crc = 0.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

}  // namespace dtrain
