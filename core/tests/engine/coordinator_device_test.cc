// Horovod's CPU/GPU rules in negotiation: the ranks must agree on where a tensor lives, and a GPU's
// float16 reduction is scaled by factors rounded as Horovod's GPU kernels round them.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "engine/negotiation/coordinator.h"
#include "coordinator_requests.h"

namespace nezha::engine {
namespace {

using testing::allgather;
using testing::allreduce;
using testing::mismatch_error;
using testing::options;
using testing::submit_all;
using testing::t0;

TEST(CoordinatorDeviceTest, MismatchedDeviceNamesTensorFieldAndRanks) {
  Request gpu = allreduce("d"), cpu = allreduce("d");
  gpu.device = Device::kGpu;
  std::string e = mismatch_error({gpu, cpu, gpu});
  EXPECT_NE(e.find("'d'"), std::string::npos) << e;
  EXPECT_NE(e.find("device (CPU/GPU)"), std::string::npos) << e;
  EXPECT_NE(e.find("GPU on ranks 0,2; CPU on rank 1"), std::string::npos) << e;
  // Every operation, as in Horovod, not only reductions.
  Request g = allgather("g", {2}), c = allgather("g", {3});
  c.device = Device::kGpu;
  e = mismatch_error({g, c});
  EXPECT_NE(e.find("CPU on rank 0; GPU on rank 1"), std::string::npos) << e;
}

// One response for a tensor every rank submitted alike.
Response response_for(Request r, int size) {
  Coordinator c(options(size));
  submit_all(c, size, {r}, t0);
  auto out = c.take_ready(t0);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out.at(0).kind, Response::Kind::kExecute) << out.at(0).error;
  return out.at(0);
}

TEST(CoordinatorDeviceTest, GpuFloat16ReductionsScaleByHalfPrecisionFactors) {
  // Horovod's GPU kernels round the factor to float, then to half (__float2half((float)f)), and
  // fold Average's 1/size into the postscale first. half(0.1) = 1638/16384, half(1/3) = 1365/4096.
  Request r = allreduce("h", {4}, DataType::kFloat16, ReduceOp::kAverage);
  r.prescale = 0.1;
  r.device = Device::kGpu;
  Response gpu = response_for(r, 3);
  EXPECT_EQ(gpu.op, ReduceOp::kSum);
  EXPECT_EQ(gpu.prescale, 1638.0 / 16384);
  EXPECT_EQ(gpu.postscale, 1365.0 / 4096);
  EXPECT_EQ(effective_postscale(gpu, 3), 1365.0 / 4096);

  r.type = OpType::kReducescatter;
  r.op = ReduceOp::kSum;
  r.prescale = 1;
  r.postscale = 0.7;
  Response rs = response_for(r, 2);
  EXPECT_EQ(rs.prescale, 1.0);
  EXPECT_EQ(rs.postscale, 1434.0 / 2048);  // half(0.7)

  // Float first, then half: 1 + 2^-11 + 2^-40 rounds to float 1 + 2^-11, a tie that half rounds
  // to even (1.0); rounded straight to half it would be 1 + 2^-10.
  r.prescale = 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(response_for(r, 2).prescale, 1.0);
}

TEST(CoordinatorDeviceTest, CpuFloat16AndGpuFloat32KeepTheirFactors) {
  Request r = allreduce("h", {4}, DataType::kFloat16, ReduceOp::kAverage);
  r.prescale = 0.1;
  Response cpu = response_for(r, 3);
  EXPECT_EQ(cpu.op, ReduceOp::kAverage);
  EXPECT_EQ(cpu.prescale, 0.1);
  EXPECT_EQ(cpu.postscale, 1.0);
  r.dtype = DataType::kFloat32;
  r.device = Device::kGpu;
  Response f32 = response_for(r, 3);
  EXPECT_EQ(f32.op, ReduceOp::kAverage);
  EXPECT_EQ(f32.prescale, 0.1);
}

}  // namespace
}  // namespace nezha::engine
