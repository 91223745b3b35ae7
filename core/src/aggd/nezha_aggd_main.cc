// nezha-aggd: the software aggregator an aggregation rail (agg:ADDR:PORT) reduces on.
//   nezha-aggd --listen ADDR:PORT [--secret-file F] [--pool-mb M] [--job-timeout S]
// The key comes from --secret-file or NEZHA_AGG_SECRET (ranks name the same one).
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "aggd/agg_daemon.h"

namespace {

nezha::aggd::AggDaemon* g_daemon = nullptr;
void on_signal(int) {
  if (g_daemon) g_daemon->stop();
}

int usage(const std::string& why) {
  std::cerr << "nezha-aggd: " << why << "\nusage: nezha-aggd --listen ADDR:PORT "
               "[--secret-file F] [--pool-mb M] [--job-timeout S]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  nezha::aggd::AggDaemonOptions opt;
  opt.listen.clear();
  const char* env = std::getenv("NEZHA_AGG_SECRET");
  if (env) opt.secret = env;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") return usage("the in-network aggregation daemon of nezha") == 2 ? 0 : 0;
    if (i + 1 >= argc) return usage(a + " needs a value");
    const std::string v = argv[++i];
    try {
      if (a == "--listen") opt.listen = v;
      else if (a == "--pool-mb") opt.pool_bytes = std::stoull(v) << 20;
      else if (a == "--job-timeout") opt.job_timeout_s = std::stod(v);
      else if (a == "--secret-file") {
        std::ifstream f(v, std::ios::binary);
        if (!f) return usage("cannot read --secret-file " + v);
        std::stringstream ss;
        ss << f.rdbuf();
        opt.secret = ss.str();
        while (!opt.secret.empty() && (opt.secret.back() == '\n' || opt.secret.back() == '\r')) opt.secret.pop_back();
      } else {
        return usage("unknown option " + a);
      }
    } catch (const std::exception&) {
      return usage("bad value for " + a + ": " + v);
    }
  }
  if (opt.listen.empty()) return usage("--listen ADDR:PORT is required");
  if (opt.secret.empty()) std::cerr << "nezha-aggd: warning: no key (NEZHA_AGG_SECRET / --secret-file): any peer with an empty key may join\n";
  try {
    nezha::aggd::AggDaemon daemon(opt);
    g_daemon = &daemon;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::cout << "nezha-aggd listening on " << daemon.address() << std::endl;
    daemon.run();
    g_daemon = nullptr;
  } catch (const std::exception& e) {
    std::cerr << "nezha-aggd: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
