// The wire protocol between an aggregation rail (agg_rail.h) and nezha-aggd (core/src/aggd/).
// Sans I/O: encoders build frames, decode_agg_frame() parses one from a byte buffer and checks every
// field before anyone trusts it, so the daemon's parser is a pure function that can be fuzzed.
//
// A frame is a 48-byte little-endian header and `length` payload bytes:
//
//   offset size field
//        0    4 magic   "NZAG"
//        4    1 version kAggVersion
//        5    1 type    AggType
//        6    1 dtype   DataType (kChunk/kResult; 0 otherwise)
//        7    1 op      ReduceOp (kChunk/kResult; 0 otherwise)
//        8    8 job     job id (every frame after the handshake)
//       16    8 seq     the allreduce's operation number on the rail (kJoin: the rail's epoch)
//       24    4 chunk   chunk index within the allreduce
//       28    4 chunks  chunks in the allreduce
//       32    8 count   elements in the whole allreduce
//       40    4 length  payload bytes
//       44    2 rank    sender's rank (to the daemon), 0 from the daemon
//       46    2 reserved, 0
//
// Conversation: kHello/kChallenge/kAuthResponse/kAuthResult carry auth.h's handshake (the daemon plays
// rank `size`, rail index kAggRailIndex) under the daemon's key; then kJoin {size, window,
// chunk_bytes}; the daemon answers kJoined or kError. Then each rank streams kChunk frames (at most
// `window` unanswered) and gets one kResult per chunk. kError (payload: text) ends the job's epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "transport/auth.h"

namespace nezha::transport::agg {

constexpr uint32_t kAggMagic = 0x47415A4E;  // 'N' 'Z' 'A' 'G'
constexpr uint8_t kAggVersion = 1;
constexpr size_t kAggHeaderBytes = 48;
constexpr int kAggRailIndex = -2;            // binds auth proofs to this protocol
constexpr uint32_t kMaxAggRanks = 4096;
constexpr uint32_t kMaxAggWindow = 64;
constexpr uint64_t kMinAggChunkBytes = 4096;
constexpr uint64_t kMaxAggChunkBytes = uint64_t{4} << 20;
constexpr size_t kMaxAggErrorBytes = 1024;
constexpr size_t kAggJoinBytes = 16;

enum class AggType : uint8_t {
  // auth.h's handshake, under its own numbers
  kHello = static_cast<uint8_t>(HandshakeMessage::kHello),
  kChallenge = static_cast<uint8_t>(HandshakeMessage::kChallenge),
  kAuthResponse = static_cast<uint8_t>(HandshakeMessage::kAuthResponse),
  kAuthResult = static_cast<uint8_t>(HandshakeMessage::kAuthResult),
  kJoin = 16,
  kJoined = 17,
  kChunk = 18,
  kResult = 19,
  kError = 20,
};
const char* agg_type_name(AggType type);
// A handshake frame's message (a frame of another type maps to no HandshakeMessage value).
inline HandshakeMessage handshake_message(AggType type) { return static_cast<HandshakeMessage>(type); }

struct AggHeader {
  AggType type = AggType::kChunk;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  uint64_t job = 0;
  uint64_t seq = 0;
  uint32_t chunk = 0;
  uint32_t chunks = 0;
  uint64_t count = 0;
  uint32_t length = 0;
  uint16_t rank = 0;
};

struct AggJoin {
  uint32_t size = 0;         // ranks in the job
  uint32_t window = 0;       // chunks a rank may have unanswered
  uint64_t chunk_bytes = 0;  // bytes per chunk (the last one of an allreduce may be shorter)
};

struct AggFrame {
  AggHeader header;
  const uint8_t* payload = nullptr;  // points into the decoded buffer
};

// Largest payload any frame may have given the chunk size limit (bounds the daemon's buffers).
constexpr size_t kMaxAggPayloadBytes = kMaxAggChunkBytes;

std::string encode_agg_header(const AggHeader& header);
std::string encode_agg_frame(AggHeader header, const void* payload, size_t bytes);  // sets length
std::string encode_join_payload(const AggJoin& join);

// Parses the frame at data[0, avail): returns the bytes it takes (header + payload) and fills *out,
// or 0 when more bytes are needed. Throws ProtocolError naming the field for a bad magic, version,
// type, dtype, op, non-zero reserved bytes, or a length over max_payload (checked on the header
// alone, before any payload is awaited).
size_t decode_agg_frame(const uint8_t* data, size_t avail, size_t max_payload, AggFrame* out);

// Throws ProtocolError for a join payload of the wrong size or out-of-range size/window/chunk.
AggJoin parse_join_payload(const uint8_t* payload, size_t bytes);

// Elements in chunk `chunk` of an allreduce of `count` elements cut in chunks of chunk_elems.
inline uint64_t agg_chunk_elems(uint64_t count, uint64_t chunk_elems, uint32_t chunk) {
  const uint64_t begin = uint64_t{chunk} * chunk_elems;
  return begin >= count ? 0 : (count - begin < chunk_elems ? count - begin : chunk_elems);
}
inline uint64_t agg_chunk_count(uint64_t count, uint64_t chunk_elems) {
  return count == 0 ? 1 : (count + chunk_elems - 1) / chunk_elems;  // an empty allreduce: 1 empty chunk
}

// Checks a kChunk header against the job's shape: rank < size, chunks == agg_chunk_count, chunk <
// chunks, length == that chunk's elements x dtype size. Throws ProtocolError naming the field.
void check_chunk_shape(const AggHeader& h, uint32_t size, uint64_t chunk_bytes);

}  // namespace nezha::transport::agg
