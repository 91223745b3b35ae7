// Pairwise-exchange alltoallv: in step k (1..n-1) rank r sends to r+k and receives from r-k, so
// every step is a permutation and no rank is the target of two senders at once.
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"

namespace nezha::collectives {

void alltoallv(transport::Rail& rail, const void* in, const std::vector<size_t>& send_bytes,
               void* out, const std::vector<size_t>& recv_bytes, const CollectiveOptions& opt) {
  const int n = rail.size();
  const int r = rail.rank();
  detail::require(send_bytes.size() == static_cast<size_t>(n) &&
                      recv_bytes.size() == static_cast<size_t>(n),
                  "alltoallv: " + std::to_string(send_bytes.size()) + " send and " +
                      std::to_string(recv_bytes.size()) + " receive sizes given for " +
                      std::to_string(n) + " ranks");
  detail::require(send_bytes[r] == recv_bytes[r],
                  "alltoallv: rank " + std::to_string(r) + " sends itself " +
                      std::to_string(send_bytes[r]) + " bytes but expects " +
                      std::to_string(recv_bytes[r]));
  const std::vector<size_t> send_off = detail::prefix_offsets(send_bytes);
  const std::vector<size_t> recv_off = detail::prefix_offsets(recv_bytes);
  detail::require(in != nullptr || send_off.back() == 0, "alltoallv: null input buffer");
  detail::require(out != nullptr || recv_off.back() == 0, "alltoallv: null output buffer");

  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (send_bytes[r] > 0) std::memcpy(dst + recv_off[r], src + send_off[r], send_bytes[r]);

  // Every pair exchanges a message even when it is empty: a peer cannot tell "nothing for you"
  // from "not there yet" without it, and skipping on one side only would desynchronise tags.
  for (int k = 1; k < n; ++k) {
    const int to = detail::ring_mod(r + k, n);
    const int from = detail::ring_mod(r - k, n);
    rail.sendrecv(to, src + send_off[to], send_bytes[to], from, dst + recv_off[from],
                  recv_bytes[from], make_tag(opt.seq, static_cast<uint64_t>(k)), opt.deadline);
  }
}

}  // namespace nezha::collectives
