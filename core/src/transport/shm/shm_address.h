// What a shm rail publishes as its local_address(), and the same-host rule (rail_contract.md).
//
// Two ranks may share memory only if their addresses carry the same launcher host entry, the same
// boot id (/proc/sys/kernel/random/boot_id) and the same network namespace (inode of
// /proc/self/ns/net): the network-namespace testbed's "hosts" share /dev/shm and a kernel, but not
// a namespace, so they never share memory. The address also says how to fetch the rank's segment
// (an abstract unix socket name, per network namespace) and how to recognise it (creator pid, its
// start time, a random nonce), so a segment from another job or process is refused.
#pragma once

#include <cstdint>
#include <string>

namespace nezha::transport::shm {

struct ShmAddress {
  std::string host_id;        // launcher host entry (may be empty: single-host jobs)
  std::string boot_id;
  uint64_t netns_inode = 0;
  int32_t pid = 0;
  uint64_t start_time = 0;    // clock ticks after boot (/proc/<pid>/stat field 22): pid reuse check
  std::string nonce_hex;      // 32 hex digits, random per rail instance
  std::string socket_name;    // abstract unix socket (without the leading NUL)
};

// This process's identity (host_id as given); nonce and socket name left empty.
ShmAddress local_identity(const std::string& host_id);
uint64_t process_start_time(int32_t pid);  // 0 if the process is gone

std::string encode_address(const ShmAddress& a);
// Throws InvalidArgument naming `who` if bytes are not a shm rail address.
ShmAddress decode_address(const std::string& bytes, const std::string& who);

// Empty if a and b are on the same host; else which part differs (for error messages).
std::string same_host_mismatch(const ShmAddress& a, const ShmAddress& b);
// Bytes equal for exactly the addresses same_host_mismatch() puts on one host (Rail::host_key).
std::string host_key(const ShmAddress& a);

std::string to_hex(const std::string& bytes);
// Throws InvalidArgument naming `who` for odd length or a non-hex digit.
std::string from_hex(const std::string& hex, const std::string& who);
std::string sha256(const std::string& data);  // the 32-byte digest

// One instance of a shm-based rail or path: the job tag its segments carry (from the secret and
// `purpose`, so the kinds never accept each other's segments), a random nonce, and this process's
// address with an abstract socket name unguessable without the secret and unique to the instance.
struct LocalEndpoint {
  std::string job_tag;  // raw 16 bytes
  std::string nonce;    // raw 16 bytes
  ShmAddress address;
};
// Throws NezhaError if no random bytes can be had.
LocalEndpoint make_local_endpoint(const std::string& purpose, const std::string& secret, const std::string& host_id);

// Whether a peer process is gone: its pidfd (>= 0) is readable, or else its pid now belongs to a
// process started at another time (or none). This process is never gone.
bool process_exited(int pidfd, int32_t pid, uint64_t start_time);

}  // namespace nezha::transport::shm
