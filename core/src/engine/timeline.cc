#include "engine/timeline.h"

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace nezha::engine {
namespace {

// Tensor names are user strings: escape them for JSON.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

Timeline::~Timeline() { close(); }

void Timeline::open(const std::string& path_pattern, int rank, const std::vector<std::string>& rail_names) {
  if (path_pattern.empty()) return;
  // Every rank writes its own trace: one path given to every rank by the launcher would be written
  // by all of them at once (unreadable JSON), so "{rank}" in it becomes this rank.
  std::string path = path_pattern;
  const std::string placeholder = "{rank}";
  for (size_t at = path.find(placeholder); at != std::string::npos;
       at = path.find(placeholder, at + 1))
    path.replace(at, placeholder.size(), std::to_string(rank));
  std::lock_guard<std::mutex> lock(mu_);
  file_ = std::fopen(path.c_str(), "w");
  if (!file_)
    throw NezhaError("cannot write the timeline to " + path + ": " + std::strerror(errno));
  rank_ = rank;
  origin_ = Clock::now();
  std::ostringstream meta;
  meta << "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank_
       << ",\"args\":{\"name\":\"rank " << rank_ << "\"}}";
  std::fputs(meta.str().c_str(), file_);
  for (size_t i = 0; i < rail_names.size(); ++i) {
    std::ostringstream t;
    t << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank_ << ",\"tid\":" << i + 1
      << ",\"args\":{\"name\":" << quoted("rail " + rail_names[i]) << "}}";
    std::fputs(t.str().c_str(), file_);
  }
}

double Timeline::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Timeline::write_event(const std::string& json) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  std::fputs(",\n", file_);
  std::fputs(json.c_str(), file_);
}

void Timeline::negotiation_event(const std::string& tensor, char phase) {
  if (!enabled()) return;
  std::ostringstream e;
  e << "{\"name\":" << quoted(tensor) << ",\"cat\":\"negotiate\",\"ph\":\"" << phase
    << "\",\"id\":" << quoted(tensor) << ",\"pid\":" << rank_ << ",\"tid\":0,\"ts\":"
    << micros(Clock::now()) << "}";
  write_event(e.str());
}

void Timeline::negotiation_started(const std::string& tensor) { negotiation_event(tensor, 'b'); }

void Timeline::negotiation_finished(const std::string& tensor) { negotiation_event(tensor, 'e'); }

void Timeline::done_by_coordinator(const std::string& tensor, size_t bytes, const char* reduced_by) {
  if (!enabled()) return;
  std::ostringstream e;
  e << "{\"name\":" << quoted(tensor) << ",\"cat\":\"control\",\"ph\":\"i\",\"s\":\"t\",\"pid\":" << rank_
    << ",\"tid\":0,\"ts\":" << micros(Clock::now()) << ",\"args\":{\"bytes\":" << bytes
    << ",\"reduced_by\":\"" << reduced_by << "\"}}";
  write_event(e.str());
}

void Timeline::share_done(int rail, const std::string& what, Clock::time_point start,
                          double seconds, double rail_seconds, size_t bytes) {
  if (!enabled()) return;
  std::ostringstream e;
  e << "{\"name\":" << quoted(what) << ",\"cat\":\"rail\",\"ph\":\"X\",\"pid\":" << rank_
    << ",\"tid\":" << rail + 1 << ",\"ts\":" << micros(start) << ",\"dur\":" << seconds * 1e6
    << ",\"args\":{\"bytes\":" << bytes << ",\"rail_us\":" << rail_seconds * 1e6 << "}}";
  write_event(e.str());
}

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace nezha::engine
