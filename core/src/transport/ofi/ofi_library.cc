#ifdef NEZHA_WITH_OFI
#include "transport/ofi/ofi_library.h"

#include <dlfcn.h>

#include <cstdlib>

#include "common/error.h"

namespace nezha::transport::ofi {

namespace {

constexpr const char* kSoname = "libfabric.so.1";

struct Loaded {
  FabricLibrary api{};
  bool ok = false;
  std::string why;
};

// libfabric versions its symbols and keeps the old versions when a struct changes, so ask for the
// version the headers we were compiled against (1.17) declare; dlsym's default (the newest) only when
// the library predates it.
void* symbol(void* handle, const char* name, const char* version) {
  void* f = dlvsym(handle, name, version);
  return f ? f : dlsym(handle, name);
}

// libfabric before 1.18: the tcp provider frees an RMA read's entry twice when its connection closes
// while the read's response is arriving (upstream a74ea0f), and the corrupted pool then crashes
// fi_close -- a rail shut down, or a connection dropped, while a cut cable stalled a rendezvous.
// ofi_rxm's read rendezvous makes every receive of a chunk such a read; its write rendezvous never
// has the receiver read. The providers read the setting once, when libfabric first initialises
// them (the first fi_getinfo), so it is set before that; a user's own value wins.
void avoid_read_rendezvous_before_1_18(void* handle) {
  using Version = uint32_t (*)();
  const auto version = reinterpret_cast<Version>(symbol(handle, "fi_version", "FABRIC_1.0"));
  if (version && version() < FI_VERSION(1, 18)) setenv("FI_OFI_RXM_USE_RNDV_WRITE", "1", /*overwrite=*/0);
}

Loaded load() {
  Loaded l;
  // RTLD_LOCAL: libfabric's providers are dlopen'ed by libfabric itself and find it on their own.
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    l.why = e ? e : "dlopen failed";
    return l;
  }
  l.api.getinfo = reinterpret_cast<decltype(l.api.getinfo)>(symbol(handle, "fi_getinfo", "FABRIC_1.3"));
  l.api.freeinfo = reinterpret_cast<decltype(l.api.freeinfo)>(symbol(handle, "fi_freeinfo", "FABRIC_1.3"));
  l.api.dupinfo = reinterpret_cast<decltype(l.api.dupinfo)>(symbol(handle, "fi_dupinfo", "FABRIC_1.3"));
  l.api.fabric = reinterpret_cast<decltype(l.api.fabric)>(symbol(handle, "fi_fabric", "FABRIC_1.1"));
  l.api.strerror = reinterpret_cast<decltype(l.api.strerror)>(symbol(handle, "fi_strerror", "FABRIC_1.0"));
  if (!l.api.getinfo || !l.api.freeinfo || !l.api.dupinfo || !l.api.fabric || !l.api.strerror) {
    l.why = std::string(kSoname) + " lacks one of fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric, fi_strerror";
    dlclose(handle);
    return l;
  }
  avoid_read_rendezvous_before_1_18(handle);
  l.ok = true;  // the handle stays open for the life of the process
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const FabricLibrary* try_fabric_library(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.api : nullptr;
}

const FabricLibrary& fabric_library(const std::string& rail) {
  std::string why;
  const FabricLibrary* api = try_fabric_library(&why);
  if (!api)
    throw NezhaError("rail '" + rail + "' (kind ofi): libfabric cannot be loaded (" + why +
                     "); install it (Debian/Ubuntu: libfabric1) to use ofi: rails");
  return *api;
}

}  // namespace nezha::transport::ofi
#endif  // NEZHA_WITH_OFI
