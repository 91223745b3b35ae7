#include "transport/shm/shm_address.h"

#include <openssl/rand.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace nezha::transport::shm {

namespace {

constexpr const char* kAddressMagic = "nezha-shm-address/1";

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The whole of `text` as a decimal number, or false.
template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && at == end && !text.empty();
}

}  // namespace

std::string from_hex(const std::string& hex, const std::string& who) {
  if (hex.size() % 2 != 0) throw InvalidArgument(who + ": malformed shm address (odd hex length)");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) throw InvalidArgument(who + ": malformed shm address (bad hex)");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

std::string sha256(const std::string& data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return std::string(reinterpret_cast<char*>(out), sizeof out);
}

LocalEndpoint make_local_endpoint(const std::string& purpose, const std::string& secret, const std::string& host_id) {
  LocalEndpoint e;
  e.job_tag = sha256("nezha-" + purpose + "-job\n" + secret).substr(0, 16);
  e.nonce.assign(16, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(e.nonce.data()), 16) != 1)
    throw NezhaError("shm " + purpose + ": RAND_bytes failed");
  e.address = local_identity(host_id);
  e.address.nonce_hex = to_hex(e.nonce);
  e.address.socket_name = "nezha-" + purpose + "-" + to_hex(sha256(secret + "\n" + e.nonce).substr(0, 16));
  return e;
}

std::string host_key(const ShmAddress& a) {
  // Length-prefixed parts, so no choice of host entry can make two different hosts' keys equal.
  return std::to_string(a.host_id.size()) + ":" + a.host_id + std::to_string(a.boot_id.size()) + ":" + a.boot_id +
         std::to_string(a.netns_inode);
}

bool process_exited(int pidfd, int32_t pid, uint64_t start_time) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  if (pid == ::getpid()) return false;
  return process_start_time(pid) != start_time;  // gone, or the pid was reused
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

uint64_t process_start_time(int32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');  // the command name may contain spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  // Fields after the name start at 3 (state); starttime is field 22.
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return std::stoull(field);
  }
  return 0;
}

ShmAddress local_identity(const std::string& host_id) {
  ShmAddress a;
  a.host_id = host_id;
  a.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) == 0) a.netns_inode = static_cast<uint64_t>(st.st_ino);
  a.pid = static_cast<int32_t>(::getpid());
  a.start_time = process_start_time(a.pid);
  return a;
}

std::string encode_address(const ShmAddress& a) {
  std::ostringstream out;
  out << kAddressMagic << "\nhost=" << to_hex(a.host_id) << "\nboot=" << a.boot_id
      << "\nnetns=" << a.netns_inode << "\npid=" << a.pid << "\nstart=" << a.start_time
      << "\nnonce=" << a.nonce_hex << "\nsocket=" << a.socket_name << "\n";
  return out.str();
}

// Every rank decodes every peer's address at start-up (the shm lane and the host placement), so
// this is one plain pass over the bytes: parsed with iostreams and sscanf, the addresses were a
// tenth of a 128-rank job's start-up CPU on one host (benchmarks/SCALE.md).
ShmAddress decode_address(const std::string& bytes, const std::string& who) {
  std::string_view rest(bytes);
  auto next_line = [&rest](std::string_view& line) {
    if (rest.empty()) return false;
    const size_t nl = rest.find('\n');
    line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    return true;
  };
  std::string_view line;
  if (!next_line(line) || line != kAddressMagic) throw InvalidArgument(who + ": not a shm rail address");
  ShmAddress a;
  int seen = 0;
  bool numbers_ok = true;
  while (next_line(line)) {
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "host") a.host_id = from_hex(std::string(value), who);
    else if (key == "boot") a.boot_id = value;
    else if (key == "netns") numbers_ok &= parse_number(value, a.netns_inode);
    else if (key == "pid") numbers_ok &= parse_number(value, a.pid);
    else if (key == "start") numbers_ok &= parse_number(value, a.start_time);
    else if (key == "nonce") a.nonce_hex = value;
    else if (key == "socket") a.socket_name = value;
    else continue;
    ++seen;
  }
  if (!numbers_ok) throw InvalidArgument(who + ": malformed shm address");
  const bool hex_nonce = a.nonce_hex.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (seen != 7 || a.pid <= 0 || a.nonce_hex.size() != 32 || !hex_nonce || a.socket_name.empty())
    throw InvalidArgument(who + ": incomplete shm address");
  return a;
}

std::string same_host_mismatch(const ShmAddress& a, const ShmAddress& b) {
  if (a.host_id != b.host_id) return "host entry '" + a.host_id + "' vs '" + b.host_id + "'";
  if (a.boot_id != b.boot_id) return "boot id " + a.boot_id + " vs " + b.boot_id;
  if (a.netns_inode != b.netns_inode)
    return "network namespace " + std::to_string(a.netns_inode) + " vs " + std::to_string(b.netns_inode);
  return "";
}

}  // namespace nezha::transport::shm
