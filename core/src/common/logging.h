// Minimal leveled logging to stderr. The level comes from NEZHA_LOG_LEVEL (trace, debug, info,
// warning, error; default warning). The only process-wide state in the core: a log level is a
// property of the process, not of an engine.
#pragma once

#include <sstream>
#include <string>

namespace nezha {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
LogLevel parse_log_level(const std::string& s);
void log_line(LogLevel level, const std::string& msg);

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { log_line(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace nezha

#define NZ_LOG(LEVEL)                                                        \
  if (::nezha::LogLevel::k##LEVEL < ::nezha::log_level()) {                  \
  } else                                                                     \
    ::nezha::LogMessage(::nezha::LogLevel::k##LEVEL).stream()
