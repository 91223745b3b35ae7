// What libfabric offers on this host, for rail discovery (nezha.rails.discover, nezharun --rails auto)
// and for naming the alternatives when a rail asks for a provider that is not there.
#pragma once

#include <string>
#include <vector>

namespace nezha::transport::ofi {

// Whether ofi rails can be opened: this build has the ofi rail (libfabric's headers were found at
// build time) and libfabric.so.1 loads now.
bool ofi_available();

// The providers (as libfabric names them, e.g. "tcp;ofi_rxm", "verbs;ofi_rxm", "shm") that offer RDM
// endpoints with tagged messages, in libfabric's order of preference, without duplicates. Empty
// without libfabric.
std::vector<std::string> ofi_rdm_providers();

}  // namespace nezha::transport::ofi
