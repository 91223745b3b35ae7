// CollectiveOptions::before_overwrite: the engine rebuilds an allreduce's input from the ranges it
// saved through this hook plus the bytes never reported (still the input). Checked the same way here,
// byte by byte, for every allreduce algorithm and schedule: a range reported late (after its bytes
// changed) or a changed byte never reported makes the rebuilt input differ.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collectives.h"
#include "rank_harness.h"
#include "typed_values.h"

namespace nezha::collectives {
namespace {

using nezha::testing::make_input;
using nezha::testing::run_ranks;
using nezha::testing::test_options;

struct Saver {
  explicit Saver(const uint8_t* buf, size_t bytes) : buf(buf), saved(bytes), covered(bytes, false) {}
  void save(size_t offset, size_t bytes) {
    ASSERT_LE(offset + bytes, saved.size()) << "range past the buffer";
    for (size_t b = offset; b < offset + bytes; ++b)
      if (!covered[b]) {
        saved[b] = buf[b];
        covered[b] = true;
      }
  }
  std::vector<uint8_t> rebuilt() const {
    std::vector<uint8_t> out(saved.size());
    for (size_t b = 0; b < out.size(); ++b) out[b] = covered[b] ? saved[b] : buf[b];
    return out;
  }
  const uint8_t* buf;
  std::vector<uint8_t> saved;
  std::vector<bool> covered;
};

void check_rebuilds_input(int size, size_t count, size_t segment_bytes, size_t logstep_max_bytes,
                          size_t send_buffer_bytes, size_t halving_max_bytes = 0) {
  const DataType dtype = DataType::kFloat32;
  std::vector<std::vector<uint8_t>> inputs, bufs;
  for (int r = 0; r < size; ++r) inputs.push_back(make_input(dtype, r, count));
  bufs = inputs;
  std::vector<std::vector<uint8_t>> rebuilt(static_cast<size_t>(size));
  run_ranks(
      size,
      [&](transport::PointToPointRail& rail) {
        auto& buf = bufs[static_cast<size_t>(rail.rank())];
        Saver saver(buf.data(), buf.size());
        CollectiveOptions opt = test_options(/*seq=*/4, segment_bytes);
        opt.logstep_max_bytes = logstep_max_bytes;
        opt.halving_max_bytes = halving_max_bytes;
        opt.before_overwrite = [&](size_t offset, size_t bytes) { saver.save(offset, bytes); };
        allreduce(rail, buf.data(), count, dtype, ReduceOp::kSum, opt);
        rebuilt[static_cast<size_t>(rail.rank())] = saver.rebuilt();
      },
      send_buffer_bytes);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(rebuilt[r], inputs[r]) << "rank " << r;
    if (size > 1 && count >= 7) EXPECT_NE(bufs[r], inputs[r]) << "rank " << r << ": nothing reduced?";
  }
}

TEST(OverwriteHook, SavedRangesRebuildTheInputForEveryAlgorithmAndSchedule) {
  for (int size : {1, 2, 3, 4, 5, 6}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{40003}}) {
      SCOPED_TRACE("ranks " + std::to_string(size) + " count " + std::to_string(count));
      check_rebuilds_input(size, count, 4096, 0, SIZE_MAX, SIZE_MAX);  // halving/doubling
      check_rebuilds_input(size, count, 4096, 0, SIZE_MAX);        // ring, pipelined
      check_rebuilds_input(size, count, 4096, 0, 0);               // ring, lock-step
      check_rebuilds_input(size, count, 1 << 20, 0, SIZE_MAX);     // ring, one segment per block
      check_rebuilds_input(size, count, 4096, SIZE_MAX, SIZE_MAX); // log-step
    }
  }
}

// Out of place the input is never written, but the engine saves it through the hook all the same
// (it may hand the input back before a redo): every byte of the output must be reported, before
// anything but its input is written there (the log-step copies the input in first, unreported).
void check_reports_every_output_byte(int size, size_t count, size_t segment_bytes, size_t logstep_max_bytes,
                                     size_t halving_max_bytes = 0) {
  const DataType dtype = DataType::kFloat32;
  std::vector<std::vector<uint8_t>> inputs, outs;
  for (int r = 0; r < size; ++r) {
    inputs.push_back(make_input(dtype, r, count));
    outs.emplace_back(inputs.back().size(), 0xEE);  // a fill no input byte below has
  }
  std::vector<std::vector<bool>> covered(static_cast<size_t>(size));
  std::vector<int> late(static_cast<size_t>(size), 0);
  run_ranks(size, [&](transport::PointToPointRail& rail) {
    const size_t r = static_cast<size_t>(rail.rank());
    auto& out = outs[r];
    covered[r].assign(out.size(), false);
    CollectiveOptions opt = test_options(/*seq=*/6, segment_bytes);
    opt.logstep_max_bytes = logstep_max_bytes;
    opt.halving_max_bytes = halving_max_bytes;
    opt.before_overwrite = [&](size_t offset, size_t bytes) {
      for (size_t b = offset; b < offset + bytes && b < out.size(); ++b) {
        if (!covered[r][b] && out[b] != 0xEE && out[b] != inputs[r][b]) ++late[r];
        covered[r][b] = true;
      }
    };
    allreduce(rail, inputs[r].data(), out.data(), count, dtype, ReduceOp::kSum, opt);
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(late[r], 0) << "rank " << r << ": bytes reported after they were written";
    if (size > 1)
      EXPECT_EQ(std::count(covered[r].begin(), covered[r].end(), false), 0) << "rank " << r << ": bytes never reported";
  }
}

TEST(OverwriteHook, OutOfPlaceEveryOutputByteIsReportedBeforeItIsWritten) {
  for (int size : {1, 2, 3, 4, 5, 6}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{40003}}) {
      SCOPED_TRACE("ranks " + std::to_string(size) + " count " + std::to_string(count));
      check_reports_every_output_byte(size, count, 4096, 0, SIZE_MAX);  // halving/doubling
      check_reports_every_output_byte(size, count, 4096, 0);         // ring
      check_reports_every_output_byte(size, count, 1 << 20, 0);      // ring, one segment per block
      check_reports_every_output_byte(size, count, 4096, SIZE_MAX);  // log-step
    }
  }
}

}  // namespace
}  // namespace nezha::collectives
