// Programs on a CUDA device: the same IR, validated the same way, run by one kernel launch per
// step or per run of element-wise steps over the same nest (fused: each thread computes the run
// at its point, intermediate results in registers, only what is read later stored), and the
// device-buffer forms of the streams (stream.hpp), in which restructuring and the device <-> host
// staging copy of a send or a receive are one pass over memory.
//
// CUDA is loaded at run time (plexus/base/cuda.hpp): a program built with CUDA runs on machines
// without a GPU, where DeviceAvailable() is false and every Run fails with its reason; a build
// without CUDA compiles and validates programs and fails the same way.
//
// Results equal the interpreter's (interpreter.hpp) bit for bit, except kPow (an exponent of
// exactly 2 computes x * x, correctly rounded; otherwise CUDA's powf, within kDevicePowMaxUlp of
// std::pow) and kLog10 (CUDA's log10f, within kDeviceLog10MaxUlp of std::log10): the bounds
// are CUDA's documented maximum errors plus the host library's half ULP.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/restructure/interpreter.hpp"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure {
namespace internal {
struct DeviceLaunch;
}  // namespace internal

inline constexpr int kDevicePowMaxUlp = 5;
inline constexpr int kDeviceLog10MaxUlp = 3;

// Whether programs can run on a device here; otherwise `why_not` says why (built without CUDA,
// no driver, no device).
bool DeviceAvailable(std::string* why_not = nullptr);

class DeviceExecutor {
 public:
  // Validates `program`; no device is needed.
  static absl::StatusOr<DeviceExecutor> Compile(Program program);

  // Runs the program on the device of the calling thread's CUDA context (or of the first
  // buffer's device). Buffers as Interpret's (declaration order, exact sizes, outputs not
  // overlapping), each in memory a kernel can reach: device, managed, or page-locked host memory
  // (InvalidArgument naming the buffer otherwise). Scratch lives on the device for the call.
  // Blocks until the results are in place; a failed launch returns the driver's error.
  absl::Status Run(absl::Span<const ConstBytes> inputs,
                   absl::Span<const MutableBytes> outputs) const;

  const Program& program() const { return program_; }
  // Kernel launches per run: element-wise steps over the same nest run as one (fused).
  int launches() const;

 private:
  DeviceExecutor() = default;
  Program program_;
  std::shared_ptr<const std::vector<internal::DeviceLaunch>> launches_;  // never null
};

// A device-buffer send of the program's one output: Create runs the program on the device with
// its output in page-locked host memory (the kernels write across the bus: the restructuring is
// the device-to-host staging copy), then Produce hands its bytes to the transport
// (Connection::PostSendProduced), never blocking on the device. `staging`: page-locked memory of
// the output's size that the caller keeps for its next messages (a sender's loop); empty: the
// stream allocates its own (page-locking memory is a slow driver call: reuse it).
class DeviceOutputStream {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceOutputStream>> Create(
      const DeviceExecutor& executor, std::vector<ConstBytes> inputs,
      MutableBytes staging = MutableBytes());
  ~DeviceOutputStream();
  size_t bytes() const { return bytes_; }
  // Writes output bytes [offset, offset + out.size()); any order. OutOfRange past the end.
  absl::Status Produce(size_t offset, absl::Span<uint8_t> out);

 private:
  DeviceOutputStream() = default;
  uint8_t* staging_ = nullptr;  // page-locked
  bool owned_ = false;          // allocated by Create
  size_t bytes_ = 0;
};

// A receive into device memory: the message's bytes land in page-locked host memory as they
// arrive (Consume, a memcpy: Connection::PostRecvConsumed's consumer), and Finish runs the
// program on the device reading them there (the restructuring is the host-to-device staging
// copy). `input` is the received input's position among the inputs; the others and the outputs
// as for Run.
class DeviceInputStream {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceInputStream>> Create(
      const DeviceExecutor& executor, int input, std::vector<ConstBytes> other_inputs,
      std::vector<MutableBytes> outputs);
  ~DeviceInputStream();
  size_t bytes() const { return bytes_; }
  // Bytes [offset, offset + in.size()) of the input, continuing where the previous piece ended
  // (InvalidArgument otherwise, or past the end).
  absl::Status Consume(size_t offset, absl::Span<const uint8_t> in);
  // Once every byte arrived: runs the program (blocks until its outputs are in place);
  // FailedPrecondition naming how many bytes are missing otherwise.
  absl::Status Finish();

 private:
  DeviceInputStream() = default;
  const DeviceExecutor* executor_ = nullptr;
  int input_ = 0;
  std::vector<ConstBytes> other_inputs_;
  std::vector<MutableBytes> outputs_;
  uint8_t* staging_ = nullptr;  // page-locked
  size_t bytes_ = 0, consumed_ = 0;
};

}  // namespace plexus::restructure
