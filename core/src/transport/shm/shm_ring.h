// The byte ring of one ordered pair (producer: the sender, consumer: the receiver), and the
// doorbell protocol that lets either end sleep.
//
// head and tail count bytes ever written / consumed; the producer copies into free space and then
// publishes head, the consumer copies out and then publishes tail, so each side only ever writes
// its own counter (single producer, single consumer; no locks). Messages are a 32-byte header
// (tag, size, mode) followed by the payload, streamed through the ring in chunks: a message of any size
// passes through a ring of any size, and the receiver starts copying out while the sender still
// copies in.
//
// Sleeping (Dekker-style, all seq_cst): a waiter sets its `sleeping` flag, reads its doorbell, re-checks
// the rings, then futex-waits on the doorbell value it read. A publisher stores head/tail and then,
// only if the other side's `sleeping` is set, bumps that side's doorbell and wakes it. Either the
// waiter's re-check sees the new head/tail, or the publisher sees the flag and the bumped doorbell
// makes the futex wait return at once: no lost wake-ups, and no syscalls while both sides are busy.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>

#include "transport/shm/shm_segment.h"

namespace nezha::transport::shm {

// Inline messages stream their payload through the ring after the header. A direct message (larger
// than the ring, and only where the receiver showed at connect that it can read the sender's
// memory: same process, or process_vm_readv allowed) carries only the header; the receiver copies
// the payload straight from the sender's buffer at `source` (one copy instead of two), then counts
// it in RingControl::direct_done, which the blocked sender waits for.
enum class MessageMode : uint64_t { kInline = 0, kDirect = 1 };
struct MessageHeader {
  uint64_t tag;
  uint64_t bytes;
  uint64_t source;  // kDirect: the payload's address in the sender's address space
  MessageMode mode;
};
static_assert(sizeof(MessageHeader) == 32, "ring message header is 32 bytes");

// Futex on a word in a MAP_SHARED mapping: not FUTEX_PRIVATE, the waiter may be another process.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long timeout_us) {
  timespec ts{static_cast<time_t>(timeout_us / 1000000), static_cast<long>(timeout_us % 1000000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Wakes the owner of `h` if it may be asleep (publisher side of the protocol above).
inline void ring_doorbell_if_sleeping(SegmentHeader* h) {
  if (h->sleeping.load(std::memory_order_seq_cst) != 0) {
    h->doorbell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&h->doorbell);
  }
}
inline void ring_doorbell(SegmentHeader* h) {
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&h->doorbell);
}

// ThreadSanitizer cannot see that two mappings of one segment are the same memory, so the
// seq_cst handshakes above do not order, for it, accesses to a buffer both sides address directly
// (a direct message between threads of one process). These annotations state that order.
#if defined(__SANITIZE_THREAD__)
#define NEZHA_SHM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NEZHA_SHM_TSAN 1
#endif
#endif
#ifdef NEZHA_SHM_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
inline void tsan_acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
inline void tsan_release(const void* p) { __tsan_release(const_cast<void*>(p)); }
#else
inline void tsan_acquire(const void*) {}
inline void tsan_release(const void*) {}
#endif

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One end of a ring as this rank sees it: control block, data, capacity, and the counter this end
// owns, cached locally (only this end writes it).
struct RingEnd {
  RingControl* control = nullptr;
  uint8_t* data = nullptr;
  uint64_t capacity = 0;
  uint64_t own = 0;  // head for the producer, tail for the consumer

  // Producer: bytes free now.
  uint64_t free_bytes() const { return capacity - (own - control->tail.load(std::memory_order_seq_cst)); }
  // Consumer: bytes readable now.
  uint64_t readable_bytes() const { return control->head.load(std::memory_order_seq_cst) - own; }

  // Copies n bytes in at `at` (wrapping); the caller checked there is room.
  void copy_in(uint64_t at, const uint8_t* src, uint64_t n) {
    const uint64_t off = at % capacity, first = std::min(n, capacity - off);
    std::memcpy(data + off, src, first);
    if (n > first) std::memcpy(data, src + first, n - first);
  }
  // Copies n readable bytes out from `at` (wrapping) without consuming them.
  void copy_out(uint64_t at, uint8_t* dst, uint64_t n) const {
    const uint64_t off = at % capacity, first = std::min(n, capacity - off);
    std::memcpy(dst, data + off, first);
    if (n > first) std::memcpy(dst + first, data, n - first);
  }
  // Publishes everything up to `at` as written (producer: head) or consumed (consumer: tail).
  void publish_head(uint64_t at) {
    own = at;
    control->head.store(at, std::memory_order_seq_cst);
  }
  void publish_tail(uint64_t at) {
    own = at;
    control->tail.store(at, std::memory_order_seq_cst);
  }
};

}  // namespace nezha::transport::shm
