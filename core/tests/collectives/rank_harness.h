// Runs one function per rank on its own thread over a fresh MemoryWorld (Gloo's base_test style:
// ranks as threads, no globals in the core), or, with NEZHA_TEST_RAIL=shm in the environment (the
// "shm." copy of this binary's tests in CMakeLists.txt), over a fresh mesh of ShmRails with small
// rings, so every algorithm test also runs over shared memory; NEZHA_TEST_RAIL=ofi ("ofi." copy) the
// same over the ofi rail (libfabric).
#pragma once

#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "memory_rail.h"
#include "transport/ofi_mesh.h"
#include "transport/shm_mesh.h"

namespace nezha::testing {

// Deadline for every test collective: long enough never to fire on a correct run, short enough
// that a bug fails the test instead of hanging the suite.
inline Deadline test_deadline() { return Deadline::after_seconds(20); }

// Runs body(*rails[r]) on one thread per rank; returns the exception each rank threw (null where
// it returned normally).
template <typename Rails>
std::vector<std::exception_ptr> run_body_on(Rails& rails, int size,
                                            const std::function<void(transport::PointToPointRail&)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*rails[r]);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline bool harness_uses_shm() {
  const char* kind = std::getenv("NEZHA_TEST_RAIL");
  return kind != nullptr && std::string(kind) == "shm";
}

// The shm variant: a ring that holds a 64 KiB segment, so pipelined and lock-step paths both run
// (send_buffer_bytes cannot be claimed here; the ring size decides it).
inline std::vector<std::exception_ptr> run_ranks_collect_shm(
    int size, const std::function<void(transport::PointToPointRail&)>& body) {
  transport::ShmRailConfig config = transport::testing::small_ring_config("collectives");
  config.ring_bytes = 96 << 10;
  auto rails = transport::testing::make_shm_mesh(size, config);
  return run_body_on(rails, size, body);
}

// The ofi variant (NEZHA_TEST_RAIL=ofi, the "ofi." copy): a mesh of OfiRails over libfabric's
// tcp;ofi_rxm provider (or NEZHA_TEST_OFI_PROVIDER) with 16 KiB chunks, so messages span many chunks.
inline bool harness_uses_ofi() {
  const char* kind = std::getenv("NEZHA_TEST_RAIL");
  return kind != nullptr && std::string(kind) == "ofi";
}


inline std::vector<std::exception_ptr> run_ranks_collect_ofi(
    int size, const std::function<void(transport::PointToPointRail&)>& body) {
#ifdef NEZHA_WITH_OFI
  // Building a mesh (endpoints, connections, handshakes) costs far more than a small collective, and
  // a test runs dozens: the last mesh is kept while every call on it succeeds (a completed collective
  // consumed every message it sent) and rebuilt after any failure or for another size.
  static std::vector<std::unique_ptr<transport::OfiRail>> mesh;
  if (mesh.size() != static_cast<size_t>(size)) {
    mesh.clear();
    mesh = transport::testing::make_ofi_mesh(size);
  }
  auto errors = run_body_on(mesh, size, body);
  for (const auto& e : errors)
    if (e) mesh.clear();
  return errors;
#else
  ADD_FAILURE() << "NEZHA_TEST_RAIL=ofi but this build has no libfabric";
  (void)body;
  return std::vector<std::exception_ptr>(static_cast<size_t>(size));
#endif
}

// Runs `body` per rank over the rails this binary's copy tests (memory, shm or ofi). send_buffer_bytes:
// what the in-memory rails claim they buffer (0 makes the algorithms run unpipelined).
inline std::vector<std::exception_ptr> run_ranks_collect(
    int size, const std::function<void(transport::PointToPointRail&)>& body,
    size_t send_buffer_bytes = std::numeric_limits<size_t>::max()) {
  if (harness_uses_shm()) return run_ranks_collect_shm(size, body);
  if (harness_uses_ofi()) return run_ranks_collect_ofi(size, body);
  MemoryWorld world(size);
  world.set_send_buffer_bytes(send_buffer_bytes);
  std::vector<transport::PointToPointRail*> rails;
  for (int r = 0; r < size; ++r) rails.push_back(&world.rail(r));
  auto errors = run_body_on(rails, size, body);
  // A completed collective consumed every message it sent.
  bool all_ok = true;
  for (auto& e : errors) all_ok = all_ok && !e;
  if (all_ok) {
    EXPECT_EQ(world.undelivered(), 0u) << "messages left in mailboxes";
  }
  return errors;
}

// Runs body on every rank and fails the test with each rank's error message if any rank threw.
inline void run_ranks(int size, const std::function<void(transport::PointToPointRail&)>& body,
                      size_t send_buffer_bytes = std::numeric_limits<size_t>::max()) {
  const auto errors = run_ranks_collect(size, body, send_buffer_bytes);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " of " << size << " threw: " << e.what();
    }
  }
}

inline collectives::CollectiveOptions test_options(uint64_t seq = 7, size_t segment_bytes = 1 << 20) {
  collectives::CollectiveOptions opt;
  opt.seq = seq;
  opt.deadline = test_deadline();
  opt.segment_bytes = segment_bytes;
  return opt;
}

}  // namespace nezha::testing
