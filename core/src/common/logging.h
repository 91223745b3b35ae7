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

// Turns the streamed message into void, for the two arms of NZ_LOG's conditional.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace nezha

// One expression (not an if/else), so `if (x) NZ_LOG(Info) << ...; else ...` binds as written. `&`
// binds looser than `<<`: the whole message is streamed before it is discarded as void.
#define NZ_LOG(LEVEL)                                           \
  (::nezha::LogLevel::k##LEVEL < ::nezha::log_level())          \
      ? (void)0                                                 \
      : ::nezha::LogVoidify() & ::nezha::LogMessage(::nezha::LogLevel::k##LEVEL).stream()
