#include "transport/rail_factory.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "common/error.h"
#include "transport/rail_kinds.h"

namespace nezha::transport {

namespace {

// The built-in table plus whatever register_rail_kind() added; filled on first use.
struct Registry {
  std::mutex mu;
  std::map<std::string, RailMaker> makers;
  Registry() {
    for (const RailKind& k : builtin_rail_kinds()) makers.emplace(k.kind, k.maker);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::unique_ptr<Rail> make_rail(const RailSpec& spec, const RailContext& ctx) {
  RailMaker maker = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.makers.find(spec.kind);
    if (it != r.makers.end()) maker = it->second;
  }
  if (!maker)
    throw InvalidArgument("rail '" + spec.name + "': unknown rail kind '" + spec.kind +
                          "' (known kinds: " + join(known_rail_kinds()) + ")");
  std::unique_ptr<Rail> rail = maker(spec, ctx);
  if (!rail) throw NezhaError("rail '" + spec.name + "': the maker of kind '" + spec.kind + "' built nothing");
  return rail;
}

std::unique_ptr<MessagePath> make_message_path(const RailSpec& spec, const RailContext& ctx) {
  std::vector<std::string> kinds;
  for (const MessagePathKind& k : builtin_message_path_kinds()) {
    if (k.kind == spec.kind) return k.maker(spec, ctx);
    kinds.push_back(k.kind);
  }
  throw InvalidArgument("control path '" + spec.name + "': rail kind '" + spec.kind +
                        "' cannot carry control messages (kinds that can: " + join(kinds) + ")");
}

void register_rail_kind(const std::string& kind, RailMaker maker) {
  if (kind.empty() || !maker) throw InvalidArgument("register_rail_kind: empty kind or no maker");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.makers.emplace(kind, maker).second)
    throw InvalidArgument("register_rail_kind: rail kind '" + kind + "' is already registered");
}

std::vector<std::string> known_rail_kinds() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [kind, maker] : r.makers) out.push_back(kind);
  return out;  // std::map keeps them sorted
}

RailSpec parse_rail_spec(const std::string& text) {
  if (text.empty()) throw InvalidArgument("rail spec is empty");
  // Options follow the first semicolon: "kind:address;key=value;key=value".
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(';', start);
    parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  RailSpec spec;
  const std::string& head = parts[0];
  const size_t colon = head.find(':');
  const std::vector<std::string> kinds = known_rail_kinds();
  if (colon != std::string::npos) {
    spec.kind = head.substr(0, colon);
    spec.local_addr = head.substr(colon + 1);
    if (spec.kind.empty()) throw InvalidArgument("rail spec '" + text + "': empty kind before ':'");
    if (spec.local_addr.empty()) throw InvalidArgument("rail spec '" + text + "': empty address after ':'");
    spec.name = spec.local_addr;
  } else if (std::find(kinds.begin(), kinds.end(), head) != kinds.end()) {
    spec.kind = head;  // a kind alone ("shm")
    spec.name = head;
  } else {
    if (head.empty()) throw InvalidArgument("rail spec '" + text + "': empty address");
    spec.kind = "tcp";
    spec.local_addr = head;
    spec.name = head;
  }
  // A ';'-part without '=' continues the target of a kind whose targets contain ';' ("ofi:tcp;ofi_rxm@..."):
  // an option is always key=value, so the split is unambiguous.
  size_t first_option = 1;
  if (rail_kind_target_may_contain_semicolons(spec.kind)) {
    for (; first_option < parts.size() && parts[first_option].find('=') == std::string::npos; ++first_option)
      spec.local_addr += ";" + parts[first_option];
    spec.name = spec.local_addr.empty() ? spec.kind : spec.local_addr;
  }
  for (size_t i = first_option; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0)
      throw InvalidArgument("rail spec '" + text + "': option '" + parts[i] + "' is not key=value");
    spec.options[parts[i].substr(0, eq)] = parts[i].substr(eq + 1);
  }
  return spec;
}

size_t rail_option_bytes(const RailSpec& spec, const std::string& option, size_t fallback) {
  auto it = spec.options.find(option);
  if (it == spec.options.end()) return fallback;
  const std::string& v = it->second;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || errno != 0 || end != v.c_str() + v.size())
    throw InvalidArgument("rail '" + spec.name + "': option " + option + "=" + v +
                          " is not a non-negative whole number");
  return static_cast<size_t>(n);
}

void reject_unknown_options(const RailSpec& spec, const std::vector<std::string>& known) {
  for (const auto& [key, value] : spec.options)
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw InvalidArgument("rail '" + spec.name + "' (kind " + spec.kind + "): unknown option '" + key +
                            "'" + (known.empty() ? " (this kind takes none)" : " (known: " + join(known) + ")"));
}

}  // namespace nezha::transport
