// Test helpers for the ofi rail: a connected set of OfiRails in one process (one thread per rank)
// over libfabric's tcp;ofi_rxm provider on 127.0.0.1, or another provider named by NEZHA_TEST_OFI_PROVIDER
// (e.g. "shm"). Small chunks and window so the chunking and window paths run with little data.
#pragma once

#ifdef NEZHA_WITH_OFI

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "rank_threads.h"
#include "transport/ofi/ofi_rail.h"

namespace nezha::transport::testing {

// Tests build hundreds of meshes; ofi_rxm's default per-connection receive buffers (many 16 KiB
// buffers per connection, each page faulted in) made building one 50-200 ms. Fewer, smaller buffers
// for tests only; libfabric reads these once, at its first call in the process (a value already set
// in the environment wins).
inline void small_libfabric_buffers_for_tests() {
  setenv("FI_OFI_RXM_MSG_RX_SIZE", "32", 0);
  setenv("FI_OFI_RXM_MSG_TX_SIZE", "32", 0);
  setenv("FI_OFI_RXM_BUFFER_SIZE", "4096", 0);
}

inline OfiRailConfig ofi_test_config(const std::string& secret = "ofi-test-secret") {
  small_libfabric_buffers_for_tests();
  OfiRailConfig c;
  const char* provider = std::getenv("NEZHA_TEST_OFI_PROVIDER");
  c.provider = provider && *provider ? provider : "tcp;ofi_rxm";
  c.node = c.provider.rfind("tcp", 0) == 0 ? "127.0.0.1" : "";
  c.name = "ofi-test";
  c.secret = secret;
  c.chunk_bytes = 16 << 10;
  c.window = 4;
  c.handshake_timeout_s = 5;
  return c;
}

inline std::vector<std::unique_ptr<OfiRail>> make_ofi_rails(int n, const OfiRailConfig& config = ofi_test_config()) {
  std::vector<std::unique_ptr<OfiRail>> rails;
  for (int r = 0; r < n; ++r) rails.push_back(std::make_unique<OfiRail>(config, r, n));
  return rails;
}

inline std::vector<std::string> ofi_addresses(const std::vector<std::unique_ptr<OfiRail>>& rails) {
  std::vector<std::string> addrs;
  for (const auto& r : rails) addrs.push_back(r->local_address());
  return addrs;
}

inline std::vector<std::unique_ptr<OfiRail>> make_ofi_mesh(int n, const OfiRailConfig& config = ofi_test_config(),
                                                           double timeout_s = 20) {
  auto rails = make_ofi_rails(n, config);
  const auto addrs = ofi_addresses(rails);
  const Deadline deadline = Deadline::after_seconds(timeout_s);
  run_ranks(n, [&](int r) { rails[r]->connect(addrs, deadline); });
  return rails;
}

}  // namespace nezha::transport::testing

#endif  // NEZHA_WITH_OFI
