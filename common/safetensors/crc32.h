// zlib's CRC-32, as the per-tensor checksums of PlannedWriter / VerifyChecksums store it.
#ifndef COLI_COMMON_SAFETENSORS_CRC32_H_
#define COLI_COMMON_SAFETENSORS_CRC32_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace coli::st {

// `crc` continued over `bytes` (start from 0).
uint32_t Crc32(uint32_t crc, std::string_view bytes);
// 8 lowercase hex digits.
std::string Crc32Hex(uint32_t crc);

}  // namespace coli::st

#endif  // COLI_COMMON_SAFETENSORS_CRC32_H_
