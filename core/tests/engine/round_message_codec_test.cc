// The cache-round vector on the wire (message_codec.h): round trip, the response list's round tag,
// and corruption: every decode either returns a message or throws ProtocolError.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <typeinfo>

#include "common/error.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {
namespace {

RoundMessage sample_round() {
  RoundMessage m;
  m.round = 0x0102030405060708ull;
  m.join_gen = 3;
  m.pending = {0, 4, 17, 4095};
  m.invalidate = {2, 9};
  m.invalidate_versions = {1, 7};
  m.estimates = {{12.5, 9.75, 40}, {30, 0, 0}};
  m.operation_times = {{32768, false, 7.5e-4f}};
  return m;
}

TEST(RoundMessageCodecTest, RoundTripsEveryField) {
  RoundMessage in = sample_round();
  std::string bytes = encode(in);
  EXPECT_TRUE(is_round_message(bytes));
  RoundMessage out = decode_round_message(bytes);
  EXPECT_EQ(out.round, in.round);
  EXPECT_EQ(out.join_gen, in.join_gen);
  EXPECT_EQ(out.pending, in.pending);
  EXPECT_EQ(out.invalidate, in.invalidate);
  EXPECT_EQ(out.invalidate_versions, in.invalidate_versions);
  ASSERT_EQ(out.estimates.size(), 2u);
  EXPECT_EQ(out.estimates[0].alpha_us, 12.5);
  EXPECT_EQ(out.estimates[1].samples, 0u);
  ASSERT_EQ(out.operation_times.size(), 1u);
  EXPECT_EQ(out.operation_times[0].bytes, 32768u);
  EXPECT_FALSE(out.operation_times[0].striped);
  EXPECT_EQ(out.operation_times[0].seconds, 7.5e-4f);
  RoundMessage empty = decode_round_message(encode(RoundMessage{}));
  EXPECT_TRUE(empty.pending.empty() && empty.estimates.empty());
}

TEST(RoundMessageCodecTest, ResponseListCarriesItsRoundTag) {
  ResponseList l;
  l.round = 77;
  std::string bytes = encode(l);
  EXPECT_FALSE(is_round_message(bytes));
  EXPECT_EQ(decode_response_list(bytes).round, 77u);
  EXPECT_THROW(decode_round_message(bytes), ProtocolError);
  EXPECT_THROW(decode_response_list(encode(sample_round())), ProtocolError);
  EXPECT_THROW(decode_request_list(encode(sample_round())), ProtocolError);
}

TEST(RoundMessageCodecTest, UnsortedNegativeOrUnpairedIdsAreProtocolError) {
  RoundMessage m = sample_round();
  m.pending = {4, 4};
  EXPECT_THROW(decode_round_message(encode(m)), ProtocolError);
  m.pending = {-1};
  EXPECT_THROW(decode_round_message(encode(m)), ProtocolError);
  m = sample_round();
  m.invalidate_versions = {1};
  EXPECT_THROW(decode_round_message(encode(m)), ProtocolError);
}

TEST(RoundMessageCodecTest, EveryTruncationAndTrailingByteIsProtocolError) {
  std::string whole = encode(sample_round());
  for (size_t n = 0; n < whole.size(); ++n)
    EXPECT_THROW(decode_round_message(whole.substr(0, n)), ProtocolError) << "cut at " << n;
  EXPECT_THROW(decode_round_message(whole + "x"), ProtocolError);
}

TEST(RoundMessageCodecTest, RandomMutationsDecodeOrThrowProtocolError) {
  std::mt19937_64 rng(99);
  const std::string seed = encode(sample_round());
  int rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = seed;
    for (int e = 0, edits = 1 + static_cast<int>(rng() % 4); e < edits; ++e) {
      switch (rng() % 4) {
        case 0: m[rng() % m.size()] ^= static_cast<char>(1u << (rng() % 8)); break;
        case 1: m.resize(rng() % (m.size() + 1)); break;
        case 2: m.insert(m.begin() + static_cast<std::ptrdiff_t>(rng() % (m.size() + 1)), static_cast<char>(rng())); break;
        case 3:
          if (m.size() > 4) {
            size_t at = rng() % (m.size() - 4);
            for (size_t k = 0; k < 4; ++k) m[at + k] = static_cast<char>(0xff);
          }
          break;
      }
      if (m.empty()) m = seed.substr(0, 1);
    }
    try {
      decode_round_message(m);
    } catch (const ProtocolError&) {
      ++rejected;
    } catch (const std::exception& ex) {
      ADD_FAILURE() << "iteration " << iter << ": " << typeid(ex).name() << ": " << ex.what();
    }
  }
  EXPECT_GT(rejected, 5000);
}

}  // namespace
}  // namespace nezha::engine
