// Fuzzes the daemon's sans-I/O frame handling with a seeded PRNG: valid frames of every type,
// mutated (bytes flipped, fields set to edge values, truncated, extended, random bytes), fed through
// decode_agg_frame, the join parser, the chunk shape check and a job's contribute(). Nothing may crash,
// read past its input, or accept a frame that breaks the protocol's invariants; >= 1M inputs.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "aggd/agg_job.h"
#include "common/error.h"
#include "transport/agg/agg_protocol.h"
#include "transport/frame.h"

namespace nezha::aggd {
namespace {

using namespace transport::agg;

std::vector<std::string> seed_frames() {
  std::vector<std::string> out;
  AggHeader h;
  h.job = 42;
  for (AggType t : {AggType::kHello, AggType::kChallenge, AggType::kAuthResponse, AggType::kAuthResult,
                    AggType::kJoined, AggType::kError}) {
    h.type = t;
    out.push_back(encode_agg_frame(h, "0123456789abcdef0123456789abcdef0123", 36));
  }
  h.type = AggType::kJoin;
  const std::string join = encode_join_payload({4, 4, 4096});
  out.push_back(encode_agg_frame(h, join.data(), join.size()));
  for (int t = 0; t <= static_cast<int>(DataType::kInt16); ++t) {
    h.type = AggType::kChunk;
    h.dtype = static_cast<DataType>(t);
    h.op = static_cast<ReduceOp>(t % kNumReduceOps);
    h.count = 1500 / dtype_size(h.dtype);
    h.chunks = 1;
    h.chunk = 0;
    h.rank = static_cast<uint16_t>(t % 4);
    std::string payload(h.count * dtype_size(h.dtype), static_cast<char>(t));
    out.push_back(encode_agg_frame(h, payload.data(), payload.size()));
  }
  return out;
}

TEST(AggFrameFuzz, AMillionMutatedFramesNeverCrashOrBreakInvariants) {
  const std::vector<std::string> seeds = seed_frames();
  std::mt19937_64 gen(20261125);
  const AggJoin shape{4, 4, 4096};
  auto job = std::make_unique<AggJob>(42, 1, shape);
  size_t decoded = 0, rejected = 0, incomplete = 0, contributed = 0, refused_by_job = 0;
  const size_t kInputs = 1000000;
  std::string buf;
  for (size_t iter = 0; iter < kInputs; ++iter) {
    buf = seeds[gen() % seeds.size()];
    const int mutations = static_cast<int>(gen() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (gen() % 6) {
        case 0:  // flip a byte (header bytes most often: that is where the parser decides)
          if (!buf.empty()) buf[gen() % std::min<size_t>(buf.size(), gen() % 2 ? 48 : buf.size())] ^= static_cast<char>(1 + gen() % 255);
          break;
        case 1:  // truncate
          buf.resize(gen() % (buf.size() + 1));
          break;
        case 2:  // extend with random bytes
          for (size_t k = gen() % 64; k > 0; --k) buf.push_back(static_cast<char>(gen()));
          break;
        case 3: {  // an edge value in one 4-byte field
          if (buf.size() >= 48) {
            const size_t off = 8 + 4 * (gen() % 10);
            const uint32_t edges[] = {0, 1, 0x7fffffffu, 0xffffffffu, 4096, 4097};
            transport::put_le(reinterpret_cast<uint8_t*>(buf.data()) + off, edges[gen() % 6], 4);
          }
          break;
        }
        case 4:  // pure noise of random length
          buf.assign(gen() % 128, '\0');
          for (auto& ch : buf) ch = static_cast<char>(gen());
          break;
        default:
          break;
      }
    }
    const size_t max_payload = gen() % 2 ? 64 : shape.chunk_bytes;
    AggFrame f;
    size_t used = 0;
    try {
      used = decode_agg_frame(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), max_payload, &f);
    } catch (const ProtocolError&) {
      ++rejected;
      continue;
    }
    if (used == 0) {
      ++incomplete;
      continue;
    }
    ++decoded;
    ASSERT_LE(used, buf.size());
    ASSERT_EQ(used, kAggHeaderBytes + f.header.length);
    ASSERT_LE(f.header.length, max_payload);
    try {
      if (f.header.type == AggType::kJoin) parse_join_payload(f.payload, f.header.length);
      if (f.header.type == AggType::kChunk) {
        job->contribute(f.header, f.payload);
        ++contributed;
        ASSERT_LE(job->open_slots(), shape.window);
      }
    } catch (const ProtocolError&) {
      ++refused_by_job;
      // The daemon fails the job on any such error: start a fresh one, as it would.
      if (f.header.type == AggType::kChunk) job = std::make_unique<AggJob>(42, 1, shape);
    }
  }
  EXPECT_EQ(decoded + rejected + incomplete, kInputs);
  // The mix must reach every outcome, or the fuzzer is not exercising the parser.
  EXPECT_GT(decoded, kInputs / 10);
  EXPECT_GT(rejected, kInputs / 10);
  EXPECT_GT(incomplete, 1000u);
  EXPECT_GT(contributed, 1000u);
  EXPECT_GT(refused_by_job, 1000u);
}

}  // namespace
}  // namespace nezha::aggd
