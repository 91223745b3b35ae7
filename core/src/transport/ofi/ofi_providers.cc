#include "transport/ofi/ofi_providers.h"

#include <algorithm>

#ifdef NEZHA_WITH_OFI
#include <rdma/fabric.h>

#include "transport/ofi/ofi_library.h"
#endif

namespace nezha::transport::ofi {

#ifdef NEZHA_WITH_OFI

bool ofi_available() { return try_fabric_library() != nullptr; }

std::vector<std::string> ofi_rdm_providers() {
  std::vector<std::string> out;
  const FabricLibrary* lib = try_fabric_library();
  if (!lib) return out;
  fi_info* hints = lib->allocinfo();
  if (!hints) return out;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  fi_info* list = nullptr;
  if (lib->getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &list) == 0) {
    for (fi_info* i = list; i; i = i->next) {
      const std::string name = i->fabric_attr && i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
      if (!name.empty() && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    }
    lib->freeinfo(list);
  }
  lib->freeinfo(hints);
  return out;
}

#else

bool ofi_available() { return false; }
std::vector<std::string> ofi_rdm_providers() { return {}; }

#endif

}  // namespace nezha::transport::ofi
