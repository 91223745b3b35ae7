// The ofi rail's local_address() bytes: which provider the endpoint belongs to plus its raw
// fi_getname() address, so a rank whose rail opened another provider is named instead of being fed
// an address its provider cannot parse.
//
//   "OFI1" | u8 provider-name length | provider name | raw endpoint address (any bytes)
#pragma once

#include <string>

namespace nezha::transport::ofi {

struct OfiAddress {
  std::string provider;  // libfabric's name for the provider, e.g. "tcp;ofi_rxm"
  std::string raw;       // fi_getname() bytes
};

std::string encode_address(const OfiAddress& address);
// Throws ProtocolError naming `rank` and `rail` if the bytes are not an ofi address.
OfiAddress decode_address(const std::string& bytes, int rank, const std::string& rail);

// "PROVIDER@ADDRESS" (the target of an ofi: rail spec) split at the last '@'; a target without '@'
// is a provider alone (shm). Throws InvalidArgument naming the rail for an empty provider.
struct OfiTarget {
  std::string provider;
  std::string node;  // empty: the provider picks (shm)
};
OfiTarget parse_target(const std::string& target, const std::string& rail);

}  // namespace nezha::transport::ofi
