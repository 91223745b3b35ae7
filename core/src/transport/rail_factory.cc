#include "transport/rail_factory.h"

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <mutex>

#include "common/error.h"
#include "common/usable_cores.h"

namespace nezha::transport {

const std::vector<RailKind>& builtin_rail_kinds();  // rail_kinds.cc

namespace {

// The built-in rows plus whatever register_rail_kind() added; filled on first use. A deque keeps
// rows where they are as it grows, so find_rail_kind() can hand out pointers.
struct Registry {
  std::mutex mu;
  std::deque<RailKind> rows;
  Registry() {
    for (const RailKind& k : builtin_rail_kinds()) rows.push_back(k);
  }
  const RailKind* find(const std::string& kind) const {
    for (const RailKind& k : rows)
      if (k.kind == kind) return &k;
    return nullptr;
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

bool ranks_outnumber_cores(const RailContext& ctx) {
  return (ctx.local_size > 0 ? ctx.local_size : ctx.size) > usable_cores();
}

std::unique_ptr<Rail> make_rail(const RailSpec& spec, const RailContext& ctx) {
  const RailKind* row = find_rail_kind(spec.kind);
  if (!row)
    throw InvalidArgument("rail '" + spec.name + "': unknown rail kind '" + spec.kind +
                          "' (known kinds: " + join(known_rail_kinds()) + ")");
  std::unique_ptr<Rail> rail = row->maker(spec, ctx);
  if (!rail) throw NezhaError("rail '" + spec.name + "': the maker of kind '" + spec.kind + "' built nothing");
  if (!rail->as_point_to_point() && !rail->as_collective())
    throw NezhaError("rail '" + spec.name + "': the maker of kind '" + spec.kind +
                     "' built a rail that is neither point-to-point nor collective");
  return rail;
}

std::unique_ptr<MessagePath> make_message_path(const RailSpec& spec, const RailContext& ctx) {
  const RailKind* row = find_rail_kind(spec.kind);
  if (row && row->message_path) return row->message_path(spec, ctx);
  std::vector<std::string> kinds;
  for (const RailKind& k : rail_kind_table())
    if (k.message_path) kinds.push_back(k.kind);
  throw InvalidArgument("control path '" + spec.name + "': rail kind '" + spec.kind +
                        "' cannot carry control messages (kinds that can: " + join(kinds) + ")");
}

void register_rail_kind(const RailKind& row) {
  if (row.kind.empty() || !row.maker) throw InvalidArgument("register_rail_kind: empty kind or no maker");
  for (char c : row.kind)
    if (c == ':' || c == ';' || c == ',' || c == '@' || std::isspace(static_cast<unsigned char>(c)) ||
        std::tolower(static_cast<unsigned char>(c)) != c)
      throw InvalidArgument("register_rail_kind: '" + row.kind + "' is not a lower-case name without : ; , @ or spaces");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.find(row.kind)) throw InvalidArgument("register_rail_kind: rail kind '" + row.kind + "' is already registered");
  r.rows.push_back(row);
}

const RailKind* find_rail_kind(const std::string& kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.find(kind);
}

std::vector<RailKind> rail_kind_table() {
  Registry& r = registry();
  std::vector<RailKind> out;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    out.assign(r.rows.begin(), r.rows.end());
  }
  std::sort(out.begin(), out.end(), [](const RailKind& a, const RailKind& b) { return a.kind < b.kind; });
  return out;
}

std::vector<std::string> known_rail_kinds() {
  std::vector<std::string> out;
  for (const RailKind& k : rail_kind_table()) out.push_back(k.kind);
  return out;
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
