// libfabric, loaded when an ofi rail first needs it rather than linked: nezha._core must import on a
// machine without libfabric (the wheel does not depend on it), and only asking for an ofi: rail there
// should fail, naming what is missing.
//
// Only five of the libfabric functions the rail calls are exported symbols; everything else
// (fi_domain, fi_tsend, fi_cq_read, ...) is an inline wrapper in libfabric's headers that calls through
// the operation tables of the objects these return, so it needs no loading.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <string>

namespace nezha::transport::ofi {

struct FabricLibrary {
  decltype(&::fi_getinfo) getinfo;
  decltype(&::fi_freeinfo) freeinfo;
  decltype(&::fi_dupinfo) dupinfo;
  decltype(&::fi_fabric) fabric;
  decltype(&::fi_strerror) strerror;

  fi_info* allocinfo() const { return dupinfo(nullptr); }  // what the fi_allocinfo() macro does
};

// Loads libfabric.so.1 once per process. Null when it cannot be loaded; `why` (if given) then says
// why (dlerror's text).
const FabricLibrary* try_fabric_library(std::string* why = nullptr);

// The same, throwing NezhaError naming `rail` and the missing library when it cannot be loaded.
const FabricLibrary& fabric_library(const std::string& rail);

}  // namespace nezha::transport::ofi
