// Internals shared by the ofi rail's data path (ofi_rail.cc) and its lifecycle (ofi_rail_lifecycle.cc):
// the wire-tag layout, one direction of a transfer (Stream), a posted chunk (Op). Not a public header.
#pragma once
#ifdef NEZHA_WITH_OFI

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/deadline.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/ofi/ofi_rail.h"

namespace nezha::transport {
namespace ofi_detail {

constexpr uint64_t kHandshakeBit = uint64_t{1} << 63;
constexpr uint64_t kLastChunkBit = uint64_t{1} << 62;
constexpr int kEpochShift = 56;
constexpr int kEpochBits = 6;
constexpr uint64_t kEpochMask = (uint64_t{1} << kEpochBits) - 1;
constexpr uint64_t kUserTagLimit = uint64_t{1} << kEpochShift;
// close(): how long the cancelled receives and other completions are reaped before the endpoint
// is closed (ofi_rail_lifecycle.cc says why).
constexpr double kCloseDrainS = 0.5;
// A handshake message: one FrameType byte, then the auth.h payload.
constexpr size_t kHandshakeMessageBytes = 1 + kMaxHandshakePayloadBytes;

inline std::string seconds_since(Clock::time_point start) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::chrono::duration<double>(Clock::now() - start).count());
  return buf;
}

inline std::string typed(FrameType type, const std::string& payload) {
  return std::string(1, static_cast<char>(type)) + payload;
}

}  // namespace ofi_detail

struct OfiRail::Stream {
  // exact: a data message of exactly `bytes`, in chunks of chunk_bytes; else one message of at most
  // `bytes` (handshake).
  Stream(bool is_recv, int peer, uint64_t tag, uint64_t wire_tag, void* data, size_t bytes, size_t chunk_bytes,
         bool exact = true)
      : is_recv(is_recv), peer(peer), tag(tag), wire_tag(wire_tag), data(static_cast<uint8_t*>(data)),
        bytes(bytes), exact(exact),
        chunks(exact ? std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes) : 1) {}
  bool is_recv;
  int peer;
  uint64_t tag;       // the caller's tag, named in errors
  uint64_t wire_tag;  // without kLastChunkBit
  uint8_t* data;
  size_t bytes;       // exact size, or the largest accepted (!exact: one chunk)
  bool exact;
  size_t chunks;
  size_t posted = 0, done = 0, in_flight = 0;
  size_t received = 0;   // bytes received so far (receives)
  std::string error;     // the first failure; empty while fine
  bool protocol_error = false;
  bool buffered = false;  // a send the caller may leave once every chunk is posted (send_buffer_bytes)
  bool finished() const { return done == chunks || (buffered && posted == chunks); }
};

// Marks a data call (or reset) as the reader of the completion queue while it runs; afterwards the
// progress thread takes over whatever sends it left behind. Constructed and destroyed under fab_mu_.
struct OfiRail::Driving {
  OfiRail* rail;
  explicit Driving(OfiRail* r) : rail(r) { rail->active_ = true; }
  ~Driving() {
    rail->active_ = false;
    if (rail->detached_sends_) rail->progress_cv_.notify_one();
  }
};

struct OfiRail::Op {
  fi_context2 context;  // first: a completion's op_context points here, i.e. at the Op
  size_t slot = 0;
  bool busy = false;        // posted and not yet completed (the slot is the provider's)
  Stream* owner = nullptr;  // null once the stream gave up on it (orphan)
  bool is_recv = false;
  bool last = false;
  int peer = -1;
  size_t chunk = 0, offset = 0, bytes = 0;
  int drain_pattern = -1;  // >= 0: a receive of drain_stale_epoch(), for that epoch pattern
};

}  // namespace nezha::transport
#endif  // NEZHA_WITH_OFI
