#include "transport/agg/agg_protocol.h"

#include <cstring>

#include "common/error.h"
#include "transport/frame.h"

namespace nezha::transport::agg {

namespace {

bool known_type(uint8_t t) {
  return (t >= 1 && t <= 4) || (t >= 16 && t <= 20);
}

[[noreturn]] void bad(const std::string& what) { throw ProtocolError("aggregation frame: " + what); }

}  // namespace

const char* agg_type_name(AggType type) {
  switch (type) {
    case AggType::kHello:
    case AggType::kChallenge:
    case AggType::kAuthResponse:
    case AggType::kAuthResult: return transport::handshake_message_name(handshake_message(type));
    case AggType::kJoin: return "join";
    case AggType::kJoined: return "joined";
    case AggType::kChunk: return "chunk";
    case AggType::kResult: return "result";
    case AggType::kError: return "error";
  }
  return "unknown";
}

std::string encode_agg_header(const AggHeader& h) {
  std::string out(kAggHeaderBytes, '\0');
  uint8_t* b = reinterpret_cast<uint8_t*>(out.data());
  put_le(b, kAggMagic, 4);
  b[4] = kAggVersion;
  b[5] = static_cast<uint8_t>(h.type);
  b[6] = static_cast<uint8_t>(h.dtype);
  b[7] = static_cast<uint8_t>(h.op);
  put_le(b + 8, h.job, 8);
  put_le(b + 16, h.seq, 8);
  put_le(b + 24, h.chunk, 4);
  put_le(b + 28, h.chunks, 4);
  put_le(b + 32, h.count, 8);
  put_le(b + 40, h.length, 4);
  put_le(b + 44, h.rank, 2);
  return out;
}

std::string encode_agg_frame(AggHeader header, const void* payload, size_t bytes) {
  header.length = static_cast<uint32_t>(bytes);
  std::string out = encode_agg_header(header);
  if (bytes) out.append(static_cast<const char*>(payload), bytes);
  return out;
}

std::string encode_join_payload(const AggJoin& j) {
  std::string out(kAggJoinBytes, '\0');
  uint8_t* b = reinterpret_cast<uint8_t*>(out.data());
  put_le(b, j.size, 4);
  put_le(b + 4, j.window, 4);
  put_le(b + 8, j.chunk_bytes, 8);
  return out;
}

size_t decode_agg_frame(const uint8_t* data, size_t avail, size_t max_payload, AggFrame* out) {
  if (avail < kAggHeaderBytes) {
    // Reject a bad magic as soon as it is visible: a stranger speaking another protocol is told at once.
    if (avail >= 4 && get_le(data, 4) != kAggMagic) bad("bad magic (not a nezha aggregation peer)");
    return 0;
  }
  if (get_le(data, 4) != kAggMagic) bad("bad magic (not a nezha aggregation peer)");
  if (data[4] != kAggVersion)
    bad("version " + std::to_string(data[4]) + ", this build speaks " + std::to_string(kAggVersion));
  if (!known_type(data[5])) bad("unknown type " + std::to_string(data[5]));
  if (!is_valid_dtype(data[6])) bad("unknown dtype " + std::to_string(data[6]));
  if (!is_valid_reduce_op(data[7])) bad("unknown reduce op " + std::to_string(data[7]));
  if (get_le(data + 46, 2) != 0) bad("reserved bytes are not zero");
  AggHeader h;
  h.type = static_cast<AggType>(data[5]);
  h.dtype = static_cast<DataType>(data[6]);
  h.op = static_cast<ReduceOp>(data[7]);
  h.job = get_le(data + 8, 8);
  h.seq = get_le(data + 16, 8);
  h.chunk = static_cast<uint32_t>(get_le(data + 24, 4));
  h.chunks = static_cast<uint32_t>(get_le(data + 28, 4));
  h.count = get_le(data + 32, 8);
  h.length = static_cast<uint32_t>(get_le(data + 40, 4));
  h.rank = static_cast<uint16_t>(get_le(data + 44, 2));
  if (h.length > max_payload)
    bad(std::string(agg_type_name(h.type)) + " frame of " + std::to_string(h.length) +
        " payload bytes exceeds the limit of " + std::to_string(max_payload));
  if (avail - kAggHeaderBytes < h.length) return 0;
  out->header = h;
  out->payload = data + kAggHeaderBytes;
  return kAggHeaderBytes + h.length;
}

AggJoin parse_join_payload(const uint8_t* p, size_t bytes) {
  if (bytes != kAggJoinBytes) bad("join payload of " + std::to_string(bytes) + " bytes");
  AggJoin j;
  j.size = static_cast<uint32_t>(get_le(p, 4));
  j.window = static_cast<uint32_t>(get_le(p + 4, 4));
  j.chunk_bytes = get_le(p + 8, 8);
  if (j.size < 1 || j.size > kMaxAggRanks) bad("join for a job of " + std::to_string(j.size) + " ranks");
  if (j.window < 1 || j.window > kMaxAggWindow) bad("join with window " + std::to_string(j.window));
  if (j.chunk_bytes < kMinAggChunkBytes || j.chunk_bytes > kMaxAggChunkBytes || j.chunk_bytes % 64)
    bad("join with chunk size " + std::to_string(j.chunk_bytes) + " bytes (must be a multiple of 64 in [" +
        std::to_string(kMinAggChunkBytes) + ", " + std::to_string(kMaxAggChunkBytes) + "])");
  return j;
}

void check_chunk_shape(const AggHeader& h, uint32_t size, uint64_t chunk_bytes) {
  const size_t esize = dtype_size(h.dtype);
  if (h.rank >= size) bad("chunk from rank " + std::to_string(h.rank) + " in a job of " + std::to_string(size));
  const uint64_t chunk_elems = chunk_bytes / esize;
  if (h.count > (uint64_t{1} << 48)) bad("allreduce of " + std::to_string(h.count) + " elements");
  const uint64_t chunks = agg_chunk_count(h.count, chunk_elems);
  if (h.chunks != chunks)
    bad("rank " + std::to_string(h.rank) + " says " + std::to_string(h.chunks) + " chunks for " +
        std::to_string(h.count) + " elements, expected " + std::to_string(chunks));
  if (h.chunk >= h.chunks)
    bad("rank " + std::to_string(h.rank) + " sent chunk " + std::to_string(h.chunk) + " of " +
        std::to_string(h.chunks));
  const uint64_t expect = agg_chunk_elems(h.count, chunk_elems, h.chunk) * esize;
  if (h.length != expect)
    bad("rank " + std::to_string(h.rank) + " sent " + std::to_string(h.length) + " bytes in chunk " +
        std::to_string(h.chunk) + ", expected " + std::to_string(expect));
}

}  // namespace nezha::transport::agg
