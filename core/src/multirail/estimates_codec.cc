#include "multirail/estimates_codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"

namespace nezha::multirail {

namespace {

void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

double bits_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

}  // namespace

std::vector<uint8_t> encode_estimates(const std::vector<RailEstimate>& rails) {
  if (rails.size() > UINT16_MAX)
    throw InvalidArgument("encode_estimates: " + std::to_string(rails.size()) +
                          " rails, at most 65535 fit the wire format");
  std::vector<uint8_t> out;
  out.reserve(kEstimatesHeaderBytes + kEstimateRecordBytes * rails.size());
  put_le(out, kEstimatesMagic, 4);
  put_le(out, kEstimatesVersion, 2);
  put_le(out, rails.size(), 2);
  for (const RailEstimate& e : rails) {
    put_le(out, double_bits(e.alpha_us), 8);
    put_le(out, double_bits(e.beta_gbps), 8);
    put_le(out, e.samples, 8);
    put_le(out, double_bits(e.bulk_alpha_us), 8);
    put_le(out, double_bits(e.mid_alpha_us), 8);
    put_le(out, double_bits(e.mid_beta_gbps), 8);
    put_le(out, e.min_striped_bytes, 8);
  }
  return out;
}

std::vector<RailEstimate> decode_estimates(const uint8_t* data, size_t size) {
  if (data == nullptr && size > 0) throw InvalidArgument("decode_estimates: null buffer");
  if (size < kEstimatesHeaderBytes)
    throw ProtocolError("rail estimates: " + std::to_string(size) + " bytes, shorter than the " +
                        std::to_string(kEstimatesHeaderBytes) + "-byte header");
  const uint32_t magic = static_cast<uint32_t>(get_le(data, 4));
  if (magic != kEstimatesMagic) throw ProtocolError("rail estimates: bad magic");
  const uint16_t version = static_cast<uint16_t>(get_le(data + 4, 2));
  if (version != kEstimatesVersion)
    throw ProtocolError("rail estimates: version " + std::to_string(version) + ", expected " +
                        std::to_string(kEstimatesVersion));
  const size_t n = static_cast<size_t>(get_le(data + 6, 2));
  const size_t expected = kEstimatesHeaderBytes + kEstimateRecordBytes * n;
  if (size != expected)
    throw ProtocolError("rail estimates: " + std::to_string(n) + " rails need " +
                        std::to_string(expected) + " bytes, got " + std::to_string(size));

  std::vector<RailEstimate> rails(n);
  const uint8_t* p = data + kEstimatesHeaderBytes;
  for (size_t i = 0; i < n; ++i, p += kEstimateRecordBytes) {
    RailEstimate& e = rails[i];
    e.alpha_us = bits_double(get_le(p, 8));
    e.beta_gbps = bits_double(get_le(p + 8, 8));
    e.samples = get_le(p + 16, 8);
    e.bulk_alpha_us = bits_double(get_le(p + 24, 8));
    e.mid_alpha_us = bits_double(get_le(p + 32, 8));
    e.mid_beta_gbps = bits_double(get_le(p + 40, 8));
    e.min_striped_bytes = get_le(p + 48, 8);
    const auto valid = [](double v) { return std::isfinite(v) && v >= 0; };
    if (!valid(e.alpha_us) || !valid(e.beta_gbps) || !valid(e.bulk_alpha_us) ||
        !valid(e.mid_alpha_us) || !valid(e.mid_beta_gbps))
      throw ProtocolError("rail estimates: rail " + std::to_string(i) +
                          " has invalid alpha_us=" + std::to_string(e.alpha_us) +
                          ", beta_gbps=" + std::to_string(e.beta_gbps) +
                          ", bulk_alpha_us=" + std::to_string(e.bulk_alpha_us) +
                          ", mid_alpha_us=" + std::to_string(e.mid_alpha_us) +
                          " or mid_beta_gbps=" + std::to_string(e.mid_beta_gbps));
  }
  return rails;
}

std::vector<RailEstimate> decode_estimates(const std::vector<uint8_t>& bytes) {
  return decode_estimates(bytes.data(), bytes.size());
}

}  // namespace nezha::multirail
