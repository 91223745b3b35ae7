#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/knobs.h"

namespace nezha {
namespace {

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(parse_log_level(knob_string("NEZHA_LOG_LEVEL")))};
  return level;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

LogLevel parse_log_level(const std::string& s) {
  if (s == "trace") return LogLevel::kTrace;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "error") return LogLevel::kError;
  return LogLevel::kWarning;
}

void log_line(LogLevel level, const std::string& msg) {
  static std::mutex mu;  // keep lines from different threads whole
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[nezha %s] %s\n", level_name(level), msg.c_str());
  std::fflush(stderr);
}

}  // namespace nezha
