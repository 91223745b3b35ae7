// Binomial-tree broadcast: ceil(log2 n) rounds; in round k every rank that already has the data
// sends it to the rank 2^k further away (ranks counted relative to the root).
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
  if (vrank != 0) {
    rail.recv(to_rank(vrank - (1 << bit)), make_tag(opt.seq, static_cast<uint64_t>(bit)), buf,
              bytes, opt.deadline);
  }
  // Then send to children vrank + 2^k for every k below that bit, farthest first (the larger
  // subtree gets the data earliest).
  for (int k = bit - 1; k >= 0; --k) {
    const int child = vrank + (1 << k);
    if (child < n) {
      rail.send(to_rank(child), make_tag(opt.seq, static_cast<uint64_t>(k)), buf, bytes,
                opt.deadline);
    }
  }
}

}  // namespace nezha::collectives
