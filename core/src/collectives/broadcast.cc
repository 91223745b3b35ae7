// Binomial-tree broadcast: ceil(log2 n) rounds; in round k every rank that already has the data
// sends it to the rank 2^k further away (ranks counted relative to the root). Pipelined in
// opt.segment_bytes pieces: a rank forwards each piece as soon as it has it, so the tree's depth
// costs a few piece times rather than whole payloads, and no rank waits long in silence (the rail
// watchdog can tell a cut from a leaf waiting its turn). A rank only ever waits on its parent or its
// children, so blocking sends cannot deadlock, buffered or not.
#include <algorithm>
#include <cstdint>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"

namespace nezha::collectives {

void broadcast(transport::Rail& rail, void* buf, size_t bytes, int root,
               const CollectiveOptions& opt) {
  const int n = rail.size();
  detail::require(root >= 0 && root < n, "broadcast: root " + std::to_string(root) +
                                             " out of range for " + std::to_string(n) + " ranks");
  detail::require(buf != nullptr || bytes == 0, "broadcast: null buffer");
  if (n == 1 || bytes == 0) return;

  const int vrank = detail::ring_mod(rail.rank() - root, n);  // 0 = root
  auto to_rank = [&](int v) { return detail::ring_mod(v + root, n); };

  // Receive once, from the parent: vrank minus its lowest set bit. The tag step is that bit's
  // index, the round in which the parent sends it.
  int bit = 0;
  while ((1 << bit) < n && !(vrank & (1 << bit))) ++bit;
  // Piece p of round k travels under step p * 64 + k (k < 64 for any rank count).
  const size_t piece = std::max<size_t>(opt.segment_bytes, 1);
  uint8_t* data = static_cast<uint8_t*>(buf);
  for (size_t off = 0, p = 0; off < bytes; off += piece, ++p) {
    const size_t len = std::min(piece, bytes - off);
    if (vrank != 0) {
      rail.recv(to_rank(vrank - (1 << bit)), make_tag(opt.seq, p * 64 + static_cast<uint64_t>(bit)),
                data + off, len, opt.deadline);
    }
    // Then to children vrank + 2^k for every k below that bit, farthest first (the larger subtree
    // gets the data earliest).
    for (int k = bit - 1; k >= 0; --k) {
      const int child = vrank + (1 << k);
      if (child < n) {
        rail.send(to_rank(child), make_tag(opt.seq, p * 64 + static_cast<uint64_t>(k)), data + off,
                  len, opt.deadline);
      }
    }
  }
}

}  // namespace nezha::collectives
