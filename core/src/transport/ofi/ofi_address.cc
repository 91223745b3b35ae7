#include "transport/ofi/ofi_address.h"

#include "common/error.h"

namespace nezha::transport::ofi {

namespace {
constexpr char kMagic[] = "OFI1";
constexpr size_t kMagicBytes = 4;
}  // namespace

std::string encode_address(const OfiAddress& address) {
  if (address.provider.size() > 255) throw InvalidArgument("ofi provider name longer than 255 bytes");
  std::string out(kMagic, kMagicBytes);
  out.push_back(static_cast<char>(address.provider.size()));
  out += address.provider;
  out += address.raw;
  return out;
}

OfiAddress decode_address(const std::string& bytes, int rank, const std::string& rail) {
  const std::string who = "rail " + rail + ": rank " + std::to_string(rank) + "'s address";
  if (bytes.size() < kMagicBytes + 1 || bytes.compare(0, kMagicBytes, kMagic) != 0)
    throw ProtocolError(who + " is not an ofi endpoint address (is that rank's rail of another kind?)");
  const size_t len = static_cast<unsigned char>(bytes[kMagicBytes]);
  if (bytes.size() < kMagicBytes + 1 + len + 1)
    throw ProtocolError(who + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
  OfiAddress a;
  a.provider = bytes.substr(kMagicBytes + 1, len);
  a.raw = bytes.substr(kMagicBytes + 1 + len);
  return a;
}

OfiTarget parse_target(const std::string& target, const std::string& rail) {
  OfiTarget t;
  const size_t at = target.rfind('@');
  t.provider = target.substr(0, at);
  if (at != std::string::npos) t.node = target.substr(at + 1);
  if (t.provider.empty())
    throw InvalidArgument("rail '" + rail + "' (kind ofi): no provider; expected ofi:PROVIDER@ADDRESS, e.g. "
                          "ofi:tcp;ofi_rxm@10.50.0.0/24, ofi:verbs;ofi_rxm@10.60.0.0/24 or ofi:shm");
  if (at != std::string::npos && t.node.empty())
    throw InvalidArgument("rail '" + rail + "' (kind ofi): empty address after '@'");
  return t;
}

}  // namespace nezha::transport::ofi
