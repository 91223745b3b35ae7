// One rank's inbound segment: a header, then one single-producer/single-consumer byte ring per
// local sender (slot = the sender's index among this host's ranks). The owner is the only consumer
// of every ring in it; each peer is the only producer of its ring. The header's doorbell is the one
// futex word the owner sleeps on: a peer that fills one of its rings, or frees space in a ring the
// owner produces into (in the peer's own segment), rings it.
//
// A segment may end with a trailer: bytes after the rings that the owner's user lays out (the control
// path's host board in rank 0's segment: engine/negotiation/host_vote_board.h); zero when none.
//
// The segment is a sealed memfd (no name in /dev/shm, so nothing can be left there, whatever kills
// the job; the kernel frees it with the last mapping). Peers receive the fd over an abstract unix
// socket (shm_handoff.h) and verify the header before using it: magic, version, job tag (from the
// job secret), the creator's nonce, pid and start time from its address, the layout and the size.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace nezha::transport::shm {

constexpr uint64_t kSegmentMagic = 0x6e657a68615f7368ULL;  // "nezha_sh"
constexpr uint32_t kSegmentVersion = 3;

struct SegmentIdentity {
  std::string job_tag;   // 16 bytes derived from the job secret
  std::string nonce;     // 16 random bytes of the owning rail instance
  int32_t creator_pid = 0;
  uint64_t creator_start_time = 0;
  int32_t owner_rank = 0;
  uint32_t slots = 0;     // local ranks (rings), including the owner's unused slot
  uint64_t ring_bytes = 0;
  uint64_t trailer_bytes = 0;  // after the rings (see above)
};

struct alignas(64) RingControl {
  std::atomic<uint64_t> head{0};  // bytes ever written (producer only)
  char pad0[56];
  std::atomic<uint64_t> tail{0};  // bytes ever consumed (consumer only)
  std::atomic<uint64_t> direct_done{0};  // direct (single-copy) messages the consumer has read
  char pad1[48];
  std::atomic<uint32_t> broken{0};  // set by either end after an error on this pair
  std::atomic<uint32_t> direct_ok{0};  // the consumer can read the producer's memory (shm_ring.h)
  // Set by a producer blocked on a full ring: only then does the consumer wake it for the space it
  // frees (a producer merely asleep waits for messages, not for space).
  std::atomic<uint32_t> producer_waiting{0};
  char pad2[52];
};

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  char job_tag[16];
  char nonce[16];
  int32_t creator_pid;
  int32_t owner_rank;
  uint64_t creator_start_time;
  uint64_t ring_bytes;
  uint64_t segment_bytes;
  uint64_t trailer_bytes;
  uint64_t creator_base;  // where the creator mapped this segment (a peer's probe of direct reads)
  alignas(64) std::atomic<uint32_t> doorbell;  // futex word the owner sleeps on
  std::atomic<uint32_t> sleeping;              // 1 while the owner may be in futex_wait
  std::atomic<uint32_t> closed;                // owner closed/reset/aborted the rail
  // Control path (shm_message_path.h): while `sleeping`, each message published for the owner
  // counts this down and the one that takes it to zero rings; 1 (the default) rings for each.
  std::atomic<int32_t> wake_after;
};

size_t segment_bytes_for(uint32_t slots, uint64_t ring_bytes, uint64_t trailer_bytes = 0);

// A mapping of one segment (own or a peer's). Move-only; unmaps on destruction.
class Segment {
 public:
  Segment() = default;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;
  ~Segment() { unmap(); }

  // Creates a sealed memfd holding a fresh segment; fd() stays open until release_fd().
  static Segment create(const SegmentIdentity& id);
  // Maps a peer's segment from fd (takes ownership of fd, closes it) and checks it is exactly
  // `expected`. Throws ProtocolError saying which field differs (a stale or foreign segment).
  static Segment attach(int fd, const SegmentIdentity& expected, const std::string& who);

  bool valid() const { return base_ != nullptr; }
  int fd() const { return fd_; }
  void release_fd();
  void unmap();

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  RingControl* ring(uint32_t slot) const;
  uint8_t* ring_data(uint32_t slot) const;
  uint64_t ring_bytes() const { return header()->ring_bytes; }
  // The trailer (page-aligned; nullptr when the segment has none) and its size.
  uint8_t* trailer() const;
  uint64_t trailer_bytes() const { return header()->trailer_bytes; }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

// Why a mapped header does not match `expected` (empty if it does). Separate for the tests.
std::string header_mismatch(const SegmentHeader& h, size_t mapped_bytes, const SegmentIdentity& expected);

}  // namespace nezha::transport::shm
