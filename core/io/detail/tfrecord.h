/*
 * TFRecord framing, the container of TensorBoard event files (internal: io::SummaryWriter writes
 * with it, the tests check it). A record is
 *   uint64 length (little endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data
 * with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, as TensorFlow's lib/hash/crc32c.h
 * defines it. Pure functions; any thread.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cohort::io::detail {

// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
uint32_t maskCrc32c(uint32_t crc);
// Appends one framed record holding `data` to `out`.
void appendTfRecord(std::string& out, std::string_view data);

}  // namespace cohort::io::detail
