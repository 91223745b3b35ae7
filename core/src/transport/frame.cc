#include "transport/frame.h"

#include <cstdio>

#include "common/error.h"

namespace nezha::transport {
namespace {

constexpr size_t kReservedOffset = 24;  // bytes [24, 64) of the header: reserved, 0

bool is_known_type(uint8_t t) {
  return t >= static_cast<uint8_t>(FrameType::kHello) && t <= static_cast<uint8_t>(FrameType::kControl);
}

}  // namespace

std::string format_tag(uint64_t tag) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(tag));
  return buf;
}

const char* frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kHello:
    case FrameType::kChallenge:
    case FrameType::kAuthResponse:
    case FrameType::kAuthResult: return handshake_message_name(handshake_message(type));
    case FrameType::kData: return "data";
    case FrameType::kControl: return "control";
  }
  return "unknown";
}

void put_le(uint8_t* out, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t get_le(const uint8_t* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

HeaderBytes encode_header(FrameType type, uint64_t tag, uint64_t length) {
  HeaderBytes h{};
  put_le(&h[0], kFrameMagic, 4);
  h[4] = kFrameVersion;
  h[5] = static_cast<uint8_t>(type);
  put_le(&h[6], 0, 2);
  put_le(&h[8], tag, 8);
  put_le(&h[16], length, 8);
  return h;
}

FrameHeader parse_header(const uint8_t* bytes) {
  const uint32_t magic = static_cast<uint32_t>(get_le(bytes, 4));
  if (magic != kFrameMagic)
    throw ProtocolError("bad frame magic " + format_tag(magic) + " (expected " + format_tag(kFrameMagic) +
                        " \"NZH1\"): the peer is not a Nezha rail or the stream is out of sync");
  if (bytes[4] != kFrameVersion)
    throw ProtocolError("unsupported frame version " + std::to_string(bytes[4]) + " (this build speaks " +
                        std::to_string(kFrameVersion) + ")");
  if (!is_known_type(bytes[5]))
    throw ProtocolError("unknown frame type " + std::to_string(bytes[5]));
  for (size_t i = kReservedOffset; i < kFrameHeaderBytes; ++i) {
    if (bytes[i] != 0)
      throw ProtocolError("reserved frame header byte " + std::to_string(i) + " is " +
                          std::to_string(bytes[i]) + " (must be 0)");
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(bytes[5]);
  h.flags = static_cast<uint16_t>(get_le(bytes + 6, 2));
  h.tag = get_le(bytes + 8, 8);
  h.length = get_le(bytes + 16, 8);
  return h;
}

FrameHeader parse_header(const uint8_t* bytes, int peer, const std::string& rail) {
  try {
    return parse_header(bytes);
  } catch (const ProtocolError& e) {
    throw ProtocolError("rail " + rail + ": frame from rank " + std::to_string(peer) + ": " + e.what());
  }
}

void check_header(const FrameHeader& header, FrameType expected_type, uint64_t expected_tag,
                  uint64_t expected_length_or_max, bool exact, int peer, const std::string& rail) {
  const std::string prefix = "rail " + rail + ": frame from rank " + std::to_string(peer) + " has ";
  if (header.type != expected_type)
    throw ProtocolError(prefix + "type " + frame_type_name(header.type) + " where " +
                        frame_type_name(expected_type) + " was expected");
  if (header.tag != expected_tag)
    throw ProtocolError(prefix + "tag " + format_tag(header.tag) + " where " + format_tag(expected_tag) +
                        " was expected");
  if (exact && header.length != expected_length_or_max)
    throw ProtocolError(prefix + "length " + std::to_string(header.length) + " where " +
                        std::to_string(expected_length_or_max) + " was expected (tag " +
                        format_tag(header.tag) + ")");
  if (!exact && header.length > expected_length_or_max)
    throw ProtocolError(prefix + "length " + std::to_string(header.length) + " where at most " +
                        std::to_string(expected_length_or_max) + " was expected (tag " +
                        format_tag(header.tag) + ")");
}

}  // namespace nezha::transport
