// Rail estimates on the wire: the coordinator sends its merged view of every rail's cost model to all
// ranks (with the negotiation response), so they plan with the same numbers.
//
// Layout, all little-endian, 8 + 56 * n bytes:
//   u32 magic "NZRE" | u16 version (4) | u16 n
//   n times: f64 alpha_us | f64 beta_gbps | u64 samples | f64 bulk_alpha_us | f64 mid_alpha_us |
//            f64 mid_beta_gbps | u64 min_striped_bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "multirail/cost_model.h"

namespace nezha::multirail {

constexpr uint32_t kEstimatesMagic = 0x45525A4E;  // "NZRE" read as little-endian bytes
constexpr uint16_t kEstimatesVersion = 4;
constexpr size_t kEstimatesHeaderBytes = 8;
constexpr size_t kEstimateRecordBytes = 56;

// Throws InvalidArgument for more than 65535 rails.
std::vector<uint8_t> encode_estimates(const std::vector<RailEstimate>& rails);

// Throws ProtocolError naming what is wrong: short or over-long buffer, bad magic or version, a
// count that does not match the length, or a value no cost model produces (NaN, infinite, negative).
std::vector<RailEstimate> decode_estimates(const uint8_t* data, size_t size);
std::vector<RailEstimate> decode_estimates(const std::vector<uint8_t>& bytes);

}  // namespace nezha::multirail
