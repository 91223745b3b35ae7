// Crew: the extra threads of one rank of a shm collective rail, where the host has cores to spare.
//
// Why. One thread copying into and reducing out of shared memory moves a few GB/s; a host's memory
// moves tens. With 8 ranks on 16 cores each rank's rail thread leaves a core idle, and a 64 MB
// allreduce is bound by that one thread's copies and reductions. The crew cuts each of them (a
// chunk's copy in, a slice's reduction, the reduced slices' copy out) into contiguous byte ranges,
// one per thread, the rail's thread taking the first. Every element is still reduced by one thread
// in rank order, so the bits are those of one thread.
//
// Waiting. The crew exists only where the cores are to spare (the rail's maker): a helper spins for
// spin_us after a piece, as the rail's own waits do, then sleeps on a futex until the next one, so an
// idle rail costs no CPU. The rail's thread likewise spins, then sleeps, until every helper is done.
//
// Threads. split() is called by one thread at a time (the rail's data thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace nezha::transport::shm_coll {

class Crew {
 public:
  // `threads` in all, the caller's included (helpers: threads - 1); `min_piece_bytes`: a range is cut
  // only into pieces at least this large (a thread's wake-up costs more than copying less).
  Crew(int threads, size_t min_piece_bytes, double spin_us, const std::string& name);
  ~Crew();
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs f(begin, length) over [0, bytes) cut into consecutive pieces of whole `align` units, as many
  // as there are threads and min_piece_bytes allows, concurrently; the caller runs the first. Returns
  // once every piece ran; rethrows the first exception a piece threw.
  template <class F>
  void split(size_t bytes, size_t align, F&& f) {
    const size_t pieces = pieces_for(bytes, align);
    if (pieces <= 1) {
      if (bytes > 0) f(size_t{0}, bytes);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run(bytes, align, pieces, const_cast<void*>(static_cast<const void*>(&f)),
        [](void* fn, size_t begin, size_t len) { (*static_cast<Fn*>(fn))(begin, len); });
  }

  // Piece i of [0, bytes) cut into `pieces` of whole `align` units: {begin, length} (tests, split()).
  static std::pair<size_t, size_t> piece(size_t bytes, size_t align, size_t pieces, size_t i);

 private:
  using Trampoline = void (*)(void* fn, size_t begin, size_t len);
  size_t pieces_for(size_t bytes, size_t align) const;
  void run(size_t bytes, size_t align, size_t pieces, void* fn, Trampoline call);
  void helper(size_t index);
  void run_piece(size_t index) noexcept;

  const size_t min_piece_bytes_;
  const double spin_us_;
  // The job of the current generation (written before generation_ is bumped, read after it is seen).
  size_t bytes_ = 0, align_ = 1, pieces_ = 0;
  void* fn_ = nullptr;
  Trampoline call_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<uint32_t> pending_{0};  // helpers still on the current generation
  std::atomic<uint32_t> helpers_asleep_{0};        // on generation_'s futex, or about to be
  std::atomic<uint32_t> caller_asleep_{0};         // the caller, on pending_'s futex
  std::atomic<bool> stopping_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::vector<std::thread> helpers_;
};

}  // namespace nezha::transport::shm_coll
