// Wire frames of the point-to-point byte-stream transports (tcp; ofi reuses the handshake's types).
//
// A frame is a fixed 64-byte little-endian header followed by `length` payload bytes:
//
//   offset  size  field
//        0     4  magic   "NZH1"
//        4     1  version kFrameVersion
//        5     1  type    FrameType
//        6     2  flags   reserved, 0
//        8     8  tag     data: the collective's tag; control: per-peer sequence number
//       16     8  length  payload bytes
//       24    40  reserved, 0
//
// Why 64 bytes: the header is exactly one cache line, so a payload keeps its buffer's 64-byte
// alignment inside the kernel's socket buffers, where headers and payloads are packed back to back;
// a payload off a line makes the kernel's copies into and out of those buffers several times dearer.
//
// The receiver always knows what it expects (type, tag, exact length or an upper bound), so every
// header is checked before a single payload byte is read: a desynchronised or hostile peer is caught
// as a ProtocolError naming the peer, the rail and the field that differs, and a garbage length never
// makes us allocate a huge buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/auth.h"

namespace nezha::transport {

constexpr uint32_t kFrameMagic = 0x31485A4E;  // bytes 'N' 'Z' 'H' '1' read as a little-endian u32
constexpr uint8_t kFrameVersion = 2;
constexpr size_t kFrameHeaderBytes = 64;
static_assert(kFrameHeaderBytes % 64 == 0, "payloads must stay cache-line aligned on the wire");
// Upper bound for any frame whose payload is buffered by the transport (control and handshake
// frames); data frames are bounded by the caller's buffer instead.
constexpr uint64_t kMaxControlPayloadBytes = uint64_t{64} << 20;

enum class FrameType : uint8_t {
  // auth.h's handshake, under its own numbers
  kHello = static_cast<uint8_t>(HandshakeMessage::kHello),
  kChallenge = static_cast<uint8_t>(HandshakeMessage::kChallenge),
  kAuthResponse = static_cast<uint8_t>(HandshakeMessage::kAuthResponse),
  kAuthResult = static_cast<uint8_t>(HandshakeMessage::kAuthResult),
  kData = 5,
  kControl = 6,
};

const char* frame_type_name(FrameType type);
// A handshake frame's message (a frame of another type maps to no HandshakeMessage value).
inline HandshakeMessage handshake_message(FrameType type) { return static_cast<HandshakeMessage>(type); }
std::string format_tag(uint64_t tag);  // "0x2a", as tags appear in every error message

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint16_t flags = 0;
  uint64_t tag = 0;
  uint64_t length = 0;
};

using HeaderBytes = std::array<uint8_t, kFrameHeaderBytes>;

HeaderBytes encode_header(FrameType type, uint64_t tag, uint64_t length);

// Decodes kFrameHeaderBytes bytes. Throws ProtocolError on a bad magic, version, unknown type or
// non-zero reserved bytes.
FrameHeader parse_header(const uint8_t* bytes);
// The same, with "rail <rail>: frame from rank <peer>: " in front of any error.
FrameHeader parse_header(const uint8_t* bytes, int peer, const std::string& rail);

// Throws ProtocolError ("rail <rail>: frame from rank <peer> has <field> ... where ... was expected")
// unless the header has the expected type and tag and a length equal to expected_length_or_max
// (exact) or at most it (!exact).
void check_header(const FrameHeader& header, FrameType expected_type, uint64_t expected_tag,
                  uint64_t expected_length_or_max, bool exact, int peer, const std::string& rail);

// Little-endian integer encoding used by frame headers and handshake payloads.
void put_le(uint8_t* out, uint64_t value, size_t bytes);
uint64_t get_le(const uint8_t* in, size_t bytes);

}  // namespace nezha::transport
