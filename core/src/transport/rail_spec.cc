#include "transport/rail_spec.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "transport/rail_factory.h"

namespace nezha::transport {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool is_ipv4(const std::string& s) {
  in_addr addr{};
  return inet_pton(AF_INET, s.c_str(), &addr) == 1;
}

bool is_port(const std::string& s) {
  if (s.empty() || s.size() > 5 || !std::all_of(s.begin(), s.end(), ::isdigit)) return false;
  const int port = std::stoi(s);
  return port > 0 && port < 65536;
}

// The shape the row asks for; the message says what was expected, with the kind's own prefix.
void check_target(const RailItem& item) {
  const std::string where = "rail " + quoted(item.text) + ": ";
  switch (item.target_form) {
    case RailTarget::kNone:
      if (!item.target.empty())
        throw InvalidArgument(where + "kind " + item.kind + " takes no target (write it alone: " + item.kind + ")");
      return;
    case RailTarget::kLocalAddress:
      if (item.target.empty())
        throw InvalidArgument(where + "expected " + item.kind + ":<interface or IPv4 subnet>");
      return;
    case RailTarget::kProviderAtLocalAddress: {
      const size_t at = item.target.rfind('@');
      const std::string provider = at == std::string::npos ? item.target : item.target.substr(0, at);
      const bool where_empty = at != std::string::npos && at + 1 == item.target.size();
      if (provider.empty() || where_empty)
        throw InvalidArgument(where + "expected " + item.kind + ":PROVIDER@<interface or IPv4 subnet>, e.g. " +
                              item.kind + ":tcp;ofi_rxm@10.50.0.0/24 or " + item.kind + ":verbs;ofi_rxm@10.60.0.0/24");
      return;
    }
    case RailTarget::kHostPort: {
      const size_t colon = item.target.rfind(':');
      if (colon == std::string::npos || !is_ipv4(item.target.substr(0, colon)) ||
          !is_port(item.target.substr(colon + 1)))
        throw InvalidArgument(where + "expected " + item.kind + ":<IPv4 address>:<port>");
      return;
    }
  }
}

}  // namespace

const char* rail_target_name(RailTarget target) {
  switch (target) {
    case RailTarget::kNone: return "none";
    case RailTarget::kLocalAddress: return "local_address";
    case RailTarget::kProviderAtLocalAddress: return "provider_at_local_address";
    case RailTarget::kHostPort: return "host_port";
  }
  return "?";
}

RailItem parse_rail_item(const std::string& text) {
  RailItem item;
  item.text = trim(text);
  if (item.text.empty()) throw InvalidArgument("rail spec has an empty item");
  std::vector<std::string> parts = split(item.text, ';');
  for (auto& p : parts) p = trim(p);
  std::string head = parts[0];

  const size_t colon = head.find(':');
  const std::string named = lower(trim(head.substr(0, colon)));
  const RailKind* row = nullptr;
  if (colon != std::string::npos) {
    row = find_rail_kind(named);
    if (!row)
      throw InvalidArgument("rail " + quoted(item.text) + ": unknown rail kind " + quoted(trim(head.substr(0, colon))) +
                            "; known kinds: " + join(known_rail_kinds()));
    item.target = trim(head.substr(colon + 1));
  } else if ((row = find_rail_kind(named)) != nullptr) {
    // A kind named alone: right for a kind without a target ("shm"); for the others check_target
    // says what the target should look like.
  } else {
    row = find_rail_kind("tcp");
    item.target = head;
  }
  item.kind = row->kind;
  item.target_form = row->target;

  size_t first_option = 1;
  if (row->target_continues_after_semicolon)
    for (; first_option < parts.size() && parts[first_option].find('=') == std::string::npos; ++first_option)
      item.target += ";" + parts[first_option];
  check_target(item);

  for (size_t i = first_option; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    const std::string key = eq == std::string::npos ? "" : trim(parts[i].substr(0, eq));
    if (key.empty())
      throw InvalidArgument("rail " + quoted(item.text) + ": option " + quoted(parts[i]) + " is not key=value");
    for (const auto& [k, v] : item.options)
      if (k == key) throw InvalidArgument("rail " + quoted(item.text) + ": option " + quoted(key) + " is given twice");
    item.options.emplace_back(key, trim(parts[i].substr(eq + 1)));
  }
  return item;
}

std::vector<RailItem> parse_rail_list(const std::string& text) {
  std::vector<RailItem> items;
  for (const std::string& part : split(text, ',')) {
    if (trim(part).empty()) throw InvalidArgument("rail spec " + quoted(text) + " has an empty item");
    items.push_back(parse_rail_item(part));
  }
  return items;
}

RailSpec parse_rail_spec(const std::string& text) {
  const RailItem item = parse_rail_item(text);
  RailSpec spec;
  spec.kind = item.kind;
  spec.name = item.target.empty() ? item.kind : item.target;
  spec.local_addr = item.target;
  for (const auto& [key, value] : item.options) spec.options[key] = value;
  return spec;
}

}  // namespace nezha::transport
