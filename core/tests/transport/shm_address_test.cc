// The shm rails' address format: what encode_address writes decodes to the same fields, and every
// malformed address (a peer of another version, a corrupted store entry) is refused with the
// caller's context instead of being half-read.
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "transport/shm/shm_address.h"

namespace nezha::transport::shm {
namespace {

ShmAddress sample() {
  ShmAddress a;
  a.host_id = "node-7 (rack \"b\")\n";  // any bytes: travels hex-encoded
  a.boot_id = "0d3c0e1a-2b7e-4c55-9d2e-52e1b6e31a7f";
  a.netns_inode = 4026531840ULL;
  a.pid = 2147483647;
  a.start_time = 18446744073709551615ULL;
  a.nonce_hex = "00112233445566778899aabbccddeeff";
  a.socket_name = "nezha-shm-0011223344556677";
  return a;
}

std::string refusal(const std::string& bytes) {
  try {
    decode_address(bytes, "rank 3's address");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string with_line(const std::string& key, const std::string& value) {
  std::string text = encode_address(sample());
  const size_t at = text.find("\n" + key + "=") + 1;
  const size_t end = text.find('\n', at);
  return text.replace(at, end - at, key + "=" + value);
}

TEST(ShmAddress, DecodesWhatItEncodes) {
  const ShmAddress a = sample();
  const ShmAddress b = decode_address(encode_address(a), "test");
  EXPECT_EQ(b.host_id, a.host_id);
  EXPECT_EQ(b.boot_id, a.boot_id);
  EXPECT_EQ(b.netns_inode, a.netns_inode);
  EXPECT_EQ(b.pid, a.pid);
  EXPECT_EQ(b.start_time, a.start_time);
  EXPECT_EQ(b.nonce_hex, a.nonce_hex);
  EXPECT_EQ(b.socket_name, a.socket_name);
  EXPECT_EQ(host_key(b), host_key(a));
  EXPECT_EQ(same_host_mismatch(a, b), "");
}

TEST(ShmAddress, LocalIdentityRoundTrips) {
  ShmAddress a = local_identity("");
  a.nonce_hex = std::string(32, 'f');
  a.socket_name = "s";
  const ShmAddress b = decode_address(encode_address(a), "test");
  EXPECT_EQ(b.pid, a.pid);
  EXPECT_EQ(b.start_time, a.start_time);
  EXPECT_GT(b.start_time, 0u);
  EXPECT_EQ(b.boot_id, a.boot_id);
  EXPECT_EQ(b.netns_inode, a.netns_inode);
}

TEST(ShmAddress, UnknownKeysAndAMissingFinalNewlineAreAccepted) {
  std::string text = encode_address(sample());
  text.insert(text.find("\npid="), "\nfuture=whatever\nno equals sign here");
  text.pop_back();  // the last line without its newline
  EXPECT_EQ(decode_address(text, "test").socket_name, sample().socket_name);
}

TEST(ShmAddress, RefusesMalformedAddressesNamingTheCaller) {
  EXPECT_NE(refusal("").find("rank 3's address: not a shm rail address"), std::string::npos);
  EXPECT_NE(refusal("127.0.0.1:4000").find("not a shm rail address"), std::string::npos);
  std::string missing = encode_address(sample());
  missing.erase(missing.find("\nboot="), missing.find("\nnetns=") - missing.find("\nboot="));
  EXPECT_NE(refusal(missing).find("incomplete shm address"), std::string::npos);
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"pid", "12x"},
                                   {"pid", ""},
                                   {"pid", "99999999999"},  // beyond a pid_t
                                   {"pid", " 12"},
                                   {"netns", "-1"},
                                   {"netns", "0x10"},
                                   {"start", "18446744073709551616"}}) {
    EXPECT_NE(refusal(with_line(key, value)).find("malformed shm address"), std::string::npos) << key << "=" << value;
  }
  EXPECT_NE(refusal(with_line("pid", "0")).find("incomplete"), std::string::npos);
  EXPECT_NE(refusal(with_line("pid", "-4")).find("incomplete"), std::string::npos);
  EXPECT_NE(refusal(with_line("nonce", "00112233")).find("incomplete"), std::string::npos);
  EXPECT_NE(refusal(with_line("nonce", std::string(32, 'G'))).find("incomplete"), std::string::npos);
  EXPECT_NE(refusal(with_line("socket", "")).find("incomplete"), std::string::npos);
  EXPECT_NE(refusal(with_line("host", "abc")).find("odd hex length"), std::string::npos);
  EXPECT_NE(refusal(with_line("host", "zz")).find("bad hex"), std::string::npos);
}

TEST(ShmAddress, HexRoundTripsEveryByte) {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  EXPECT_EQ(to_hex(bytes).size(), 512u);
  EXPECT_EQ(from_hex(to_hex(bytes), "test"), bytes);
  EXPECT_EQ(from_hex("00FFaB", "test"), std::string("\x00\xff\xab", 3));
  EXPECT_EQ(from_hex("", "test"), "");
  for (const char* bad : {"0", "0g", "g0", " 1", "+1", "1 ", "-1"})
    EXPECT_THROW(from_hex(bad, "test"), InvalidArgument) << bad;
}

}  // namespace
}  // namespace nezha::transport::shm
