#include "multirail/estimates_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/error.h"

namespace nezha::multirail {
namespace {

TEST(EstimatesCodec, RoundTripIsBitExact) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> d(0, 1e4);
  for (size_t n : {0, 1, 2, 7, 300}) {
    std::vector<RailEstimate> rails;
    for (size_t i = 0; i < n; ++i) rails.push_back(RailEstimate{d(rng), d(rng), rng(), d(rng), d(rng), d(rng), rng()});
    const std::vector<uint8_t> bytes = encode_estimates(rails);
    EXPECT_EQ(bytes.size(), kEstimatesHeaderBytes + kEstimateRecordBytes * n);
    const std::vector<RailEstimate> back = decode_estimates(bytes);
    ASSERT_EQ(back.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::memcmp(&back[i].alpha_us, &rails[i].alpha_us, 8), 0);
      EXPECT_EQ(std::memcmp(&back[i].beta_gbps, &rails[i].beta_gbps, 8), 0);
      EXPECT_EQ(back[i].samples, rails[i].samples);
      EXPECT_EQ(std::memcmp(&back[i].bulk_alpha_us, &rails[i].bulk_alpha_us, 8), 0);
      EXPECT_EQ(std::memcmp(&back[i].mid_alpha_us, &rails[i].mid_alpha_us, 8), 0);
      EXPECT_EQ(std::memcmp(&back[i].mid_beta_gbps, &rails[i].mid_beta_gbps, 8), 0);
      EXPECT_EQ(back[i].min_striped_bytes, rails[i].min_striped_bytes);
    }
  }
}

TEST(EstimatesCodec, LayoutIsLittleEndianAsDocumented) {
  // alpha 1.0 = 0x3FF0000000000000, beta 2.0 = 0x4000000000000000, samples 0x0102030405060708,
  // bulk alpha 4.0 = 0x4010000000000000, mid alpha 8.0 = 0x4020000000000000, mid beta 0.5 =
  // 0x3FE0000000000000, min striped bytes 0x10001.
  const std::vector<uint8_t> expected = {
      'N', 'Z', 'R', 'E', 4, 0, 1, 0,                         // magic, version 4, one rail
      0, 0, 0, 0, 0, 0, 0xF0, 0x3F,                           // alpha_us
      0, 0, 0, 0, 0, 0, 0x00, 0x40,                           // beta_gbps
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,         // samples
      0, 0, 0, 0, 0, 0, 0x10, 0x40,                           // bulk_alpha_us
      0, 0, 0, 0, 0, 0, 0x20, 0x40,                           // mid_alpha_us
      0, 0, 0, 0, 0, 0, 0xE0, 0x3F,                           // mid_beta_gbps
      0x01, 0, 0x01, 0, 0, 0, 0, 0};                          // min_striped_bytes
  EXPECT_EQ(encode_estimates({RailEstimate{1.0, 2.0, 0x0102030405060708ull, 4.0, 8.0, 0.5, 0x10001}}), expected);
}

TEST(EstimatesCodec, RejectsMalformedBuffers) {
  const std::vector<uint8_t> good = encode_estimates({RailEstimate{50, 1, 9}, RailEstimate{60, 2, 9}});
  EXPECT_THROW(decode_estimates(nullptr, 0), ProtocolError);
  EXPECT_THROW(decode_estimates(good.data(), 5), ProtocolError);               // short header
  EXPECT_THROW(decode_estimates(good.data(), good.size() - 1), ProtocolError); // truncated record
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_THROW(decode_estimates(longer), ProtocolError);                       // trailing byte
  std::vector<uint8_t> bad = good;
  bad[0] ^= 0xFF;
  EXPECT_THROW(decode_estimates(bad), ProtocolError);                          // magic
  bad = good;
  bad[4] = 2;
  EXPECT_THROW(decode_estimates(bad), ProtocolError);                          // version
  bad = good;
  bad[6] = 3;
  EXPECT_THROW(decode_estimates(bad), ProtocolError);                          // count vs length
}

TEST(EstimatesCodec, RejectsValuesNoModelProduces) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (RailEstimate e : {RailEstimate{nan, 1, 1}, RailEstimate{1, nan, 1}, RailEstimate{inf, 1, 1},
                         RailEstimate{1, inf, 1}, RailEstimate{-1, 1, 1}, RailEstimate{1, -1, 1},
                         RailEstimate{1, 1, 1, nan}, RailEstimate{1, 1, 1, -1},
                         RailEstimate{1, 1, 1, 0, inf}, RailEstimate{1, 1, 1, 0, -1},
                         RailEstimate{1, 1, 1, 0, 0, nan}, RailEstimate{1, 1, 1, 0, 0, -1}}) {
    EXPECT_THROW(decode_estimates(encode_estimates({RailEstimate{50, 1, 2}, e})), ProtocolError);
  }
}

TEST(EstimatesCodec, RandomGarbageNeverCrashes) {
  std::mt19937_64 rng(5);
  int accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    std::vector<uint8_t> buf = encode_estimates({RailEstimate{50, 1, 2}, RailEstimate{70, 3, 4}});
    // Flip a few random bytes, sometimes resize.
    for (int k = 0; k < 3; ++k) buf[rng() % buf.size()] = static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) buf.resize(rng() % (buf.size() + 8));
    try {
      auto rails = decode_estimates(buf);
      EXPECT_EQ(buf.size(), kEstimatesHeaderBytes + kEstimateRecordBytes * rails.size());
      ++accepted;
    } catch (const ProtocolError&) {
    }
  }
  EXPECT_GT(accepted, 0);  // flips inside the doubles' mantissas still decode
}

TEST(EstimatesCodec, TooManyRailsIsRejectedOnEncode) {
  EXPECT_THROW(encode_estimates(std::vector<RailEstimate>(70000)), InvalidArgument);
}

}  // namespace
}  // namespace nezha::multirail
