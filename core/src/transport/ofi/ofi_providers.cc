#include "transport/ofi/ofi_providers.h"

#include <algorithm>

#ifdef NEZHA_WITH_OFI
#include <rdma/fabric.h>
#endif

namespace nezha::transport::ofi {

#ifdef NEZHA_WITH_OFI

bool ofi_available() { return true; }

std::vector<std::string> ofi_rdm_providers() {
  std::vector<std::string> out;
  fi_info* hints = fi_allocinfo();
  if (!hints) return out;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  fi_info* list = nullptr;
  if (fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &list) == 0) {
    for (fi_info* i = list; i; i = i->next) {
      const std::string name = i->fabric_attr && i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
      if (!name.empty() && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    }
    fi_freeinfo(list);
  }
  fi_freeinfo(hints);
  return out;
}

#else

bool ofi_available() { return false; }
std::vector<std::string> ofi_rdm_providers() { return {}; }

#endif

}  // namespace nezha::transport::ofi
