// base::cuda, the one way Plexus reaches a GPU: without a usable driver every call fails with the
// same reason and nothing crashes; with a GPU, memory, copies, streams and an embedded kernel
// work in the context a CUDA runtime program would use. The "[gpu]" cases skip (exit 77)
// without a device.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/base/cuda.hpp"
#include "plexus/kernels/reduce.hpp"
#include "support/skip.hpp"

namespace cuda = plexus::base::cuda;

TEST_CASE("cuda: without a usable driver every call says why, and nothing crashes",
          "[cuda][nodevice]") {
  std::string why;
  if (cuda::Available(&why)) {
    plexus::testing::SkipTest("a GPU is usable here, so the no-device paths cannot be reached");
  }
  INFO(why);
  REQUIRE_FALSE(why.empty());
  // The reason names what is missing: the driver library, a device, or CUDA in this build.
  CHECK((absl::StrContains(why, "libcuda.so.1") || absl::StrContains(why, "device") ||
         absl::StrContains(why, "without CUDA")));
  int host = 0;
  CHECK(cuda::PointerMemory(&host) == cuda::Memory::kHost);
  CHECK(cuda::PointerMemory(nullptr) == cuda::Memory::kHost);
  const absl::Status copy = cuda::Copy(&host, &host, sizeof host, "a test copy");
  CHECK(absl::IsFailedPrecondition(copy));
  CHECK(absl::StrContains(copy.message(), why));
  CHECK(absl::IsFailedPrecondition(cuda::AllocPinned(64).status()));
  CHECK(absl::IsFailedPrecondition(cuda::DeviceBuffer::Allocate(64).status()));
  CHECK(absl::IsFailedPrecondition(cuda::Stream::Create().status()));
  CHECK(absl::IsFailedPrecondition(cuda::Synchronize()));
  cuda::FreePinned(nullptr);
  float data[4] = {2, 4, 6, 8};
  const absl::Status divide =
      plexus::kernels::DivideOnDevice(plexus::kernels::DataType::kF32, data, 4, 2);
  CHECK(absl::IsFailedPrecondition(divide));
  CHECK(data[0] == 2);  // host memory untouched
}

namespace {
void RequireDevice() {
  std::string why;
  if (!cuda::Available(&why)) plexus::testing::SkipTest(why);
}
}  // namespace

TEST_CASE("cuda: device memory, copies and pointer kinds", "[cuda][gpu]") {
  RequireDevice();
  const size_t n = 1 << 20;
  std::vector<uint32_t> in(n), out(n, 0);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint32_t>(i * 2654435761u);
  absl::StatusOr<cuda::DeviceBuffer> device = cuda::DeviceBuffer::Allocate(n * 4);
  REQUIRE(device.ok());
  CHECK(cuda::PointerMemory(device->data()) == cuda::Memory::kDevice);
  CHECK(cuda::PointerMemory(in.data()) == cuda::Memory::kHost);
  REQUIRE(cuda::Copy(device->data(), in.data(), n * 4, "up").ok());
  REQUIRE(cuda::Copy(out.data(), device->data(), n * 4, "down").ok());
  CHECK(out == in);
  REQUIRE(cuda::Zero(device->data(), n * 4).ok());
  REQUIRE(cuda::Copy(out.data(), device->data(), n * 4, "down").ok());
  CHECK(out == std::vector<uint32_t>(n, 0));

  absl::StatusOr<void*> pinned = cuda::AllocPinned(n * 4);
  REQUIRE(pinned.ok());
  absl::StatusOr<cuda::Stream> stream = cuda::Stream::Create();
  REQUIRE(stream.ok());
  REQUIRE(stream->CopyAsync(device->data(), in.data(), n * 4, "async up").ok());
  REQUIRE(stream->CopyAsync(*pinned, device->data(), n * 4, "async down").ok());
  absl::StatusOr<cuda::Event> done = stream->Record();
  REQUIRE(done.ok());
  REQUIRE(done->Synchronize().ok());
  CHECK(std::vector<uint32_t>(static_cast<uint32_t*>(*pinned),
                              static_cast<uint32_t*>(*pinned) + n) == in);
  cuda::FreePinned(*pinned);
}

TEST_CASE("cuda: GatherOnDevice past the kernel's pointer limit, in place, at every word size",
          "[cuda][gpu]") {
  RequireDevice();
  namespace pk = plexus::kernels;
  // 18 inputs into 17 outputs: batches of 16 on both sides. Output 3 holds input 3 at its place
  // already (in place); blocks of 7, 10, 12 and 48 bytes give word sizes 1, 2, 4 and 16.
  constexpr int kIn = 18, kOut = 17;
  for (size_t block : {size_t{7}, size_t{10}, size_t{12}, size_t{48}}) {
    INFO("block " << block);
    const size_t all = block * kIn;
    std::vector<uint8_t> want(all);
    for (size_t b = 0; b < all; ++b) want[b] = static_cast<uint8_t>(b * 31 + 7);
    std::vector<absl::StatusOr<cuda::DeviceBuffer>> ins, outs;
    std::vector<const void*> in_ptrs;
    std::vector<void*> out_ptrs;
    for (int o = 0; o < kOut; ++o) {
      outs.push_back(cuda::DeviceBuffer::Allocate(all));
      REQUIRE(outs.back().ok());
      REQUIRE(cuda::Zero(outs.back()->data(), all).ok());
      out_ptrs.push_back(outs.back()->data());
    }
    for (int j = 0; j < kIn; ++j) {
      const uint8_t* from = want.data() + j * block;
      if (j == 3) {  // in place in output 3
        void* at = static_cast<uint8_t*>(out_ptrs[3]) + j * block;
        REQUIRE(cuda::Copy(at, from, block, "up").ok());
        in_ptrs.push_back(at);
        continue;
      }
      ins.push_back(cuda::DeviceBuffer::Allocate(block));
      REQUIRE(ins.back().ok());
      REQUIRE(cuda::Copy(ins.back()->data(), from, block, "up").ok());
      in_ptrs.push_back(ins.back()->data());
    }
    REQUIRE(pk::GatherOnDevice(out_ptrs.data(), kOut, in_ptrs.data(), kIn, block).ok());
    REQUIRE(cuda::Synchronize().ok());
    for (int o = 0; o < kOut; ++o) {
      INFO("output " << o);
      std::vector<uint8_t> got(all);
      REQUIRE(cuda::Copy(got.data(), out_ptrs[o], all, "down").ok());
      CHECK(got == want);
    }
  }
  CHECK(absl::IsInvalidArgument(pk::GatherOnDevice(nullptr, 0, nullptr, 1, 8)));
}

TEST_CASE("cuda: an embedded kernel runs, and a missing one is named", "[cuda][gpu]") {
  RequireDevice();
  namespace pk = plexus::kernels;
  std::vector<float> f = {2, 4, 6, -8};
  std::vector<int32_t> i = {7, -7, 9, 0};
  absl::StatusOr<cuda::DeviceBuffer> df = cuda::DeviceBuffer::Allocate(16);
  absl::StatusOr<cuda::DeviceBuffer> di = cuda::DeviceBuffer::Allocate(16);
  REQUIRE(df.ok());
  REQUIRE(di.ok());
  REQUIRE(cuda::Copy(df->data(), f.data(), 16, "up").ok());
  REQUIRE(cuda::Copy(di->data(), i.data(), 16, "up").ok());
  REQUIRE(pk::DivideOnDevice(pk::DataType::kF32, df->data(), 4, 2).ok());
  REQUIRE(pk::DivideOnDevice(pk::DataType::kI32, di->data(), 4, 2).ok());
  REQUIRE(cuda::Synchronize().ok());
  REQUIRE(cuda::Copy(f.data(), df->data(), 16, "down").ok());
  REQUIRE(cuda::Copy(i.data(), di->data(), 16, "down").ok());
  CHECK(f == std::vector<float>{1, 2, 3, -4});
  CHECK(i == std::vector<int32_t>{3, -3, 4, 0});  // C++ integer division truncates

  static const unsigned char kNotAnImage[16] = {};
  const absl::Status bad = cuda::Launch({kNotAnImage, "a test image"}, "nothing", 1, 1, nullptr);
  CHECK_FALSE(bad.ok());
  CHECK(absl::StrContains(bad.message(), "a test image"));
}
