// make_agg_rail: the factory's entry for kind "agg" (registered in rail_kinds.cc).
//   agg:ADDR:PORT[;secret_file=F][;chunk_bytes=N][;window=W][;gbps=G]
// The daemon's key: secret_file, else NEZHA_AGG_SECRET, else the job secret in hex (what nezharun
// --aggregator gives the daemon it starts).
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "transport/agg/agg_rail.h"

namespace nezha::transport {

namespace {

std::string read_secret(const RailSpec& spec, const std::string& job_secret) {
  auto it = spec.options.find("secret_file");
  if (it != spec.options.end()) {
    std::ifstream f(it->second, std::ios::binary);
    if (!f) throw InvalidArgument("rail '" + spec.name + "': cannot read secret_file " + it->second);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }
  const char* env = std::getenv("NEZHA_AGG_SECRET");
  if (env) return env;
  // A daemon nezharun --aggregator started for this job holds the job secret, hex-encoded.
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned char ch : job_secret) {
    hex.push_back(kHex[ch >> 4]);
    hex.push_back(kHex[ch & 15]);
  }
  return hex;
}

}  // namespace

std::unique_ptr<Rail> make_agg_rail(const RailSpec& spec, const RailContext& ctx) {
  reject_unknown_options(spec, {"secret_file", "chunk_bytes", "window", "gbps"});
  AggRailConfig c;
  c.daemon = spec.local_addr;  // the row's target is the daemon's ADDR:PORT
  if (c.daemon.empty())
    throw InvalidArgument("rail '" + spec.name + "' (kind agg): needs the daemon's ADDR:PORT (agg:10.0.0.9:7000)");
  c.name = spec.name.empty() ? c.daemon : spec.name;
  c.secret = read_secret(spec, ctx.secret);
  c.chunk_bytes = rail_option_bytes(spec, "chunk_bytes", c.chunk_bytes);
  c.window = static_cast<uint32_t>(rail_option_bytes(spec, "window", c.window));
  c.gbps_prior = static_cast<double>(rail_option_bytes(spec, "gbps", 0));
  c.handshake_timeout_s = ctx.handshake_timeout_s;
  return std::make_unique<AggRail>(c, ctx.rank, ctx.size);
}

}  // namespace nezha::transport
