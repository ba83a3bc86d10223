// Programs on a CUDA device (device.hpp): the host side of cuda/restructure.cu's kernels,
// launched through base::cuda (no CUDA library linked).
#include "plexus/restructure/device.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bind.hpp"
#include "device_params.hpp"
#include "plexus/base/cuda.hpp"
#include "plexus/base/status.hpp"
#include "plexus/config.hpp"

namespace plexus::restructure {
#if PLEXUS_HAVE_CUDA
namespace internal {
extern const unsigned char kRestructureFatbin[];  // generated from src/cuda/restructure.cu
}  // namespace internal
#endif

namespace cuda = base::cuda;

bool DeviceAvailable(std::string* why_not) {
#if PLEXUS_HAVE_CUDA
  return cuda::Available(why_not);
#else
  if (why_not != nullptr) *why_not = "Plexus was built without CUDA";
  return false;
#endif
}

absl::StatusOr<DeviceExecutor> DeviceExecutor::Compile(Program program) {
  PLEXUS_RETURN_IF_ERROR(Validate(program));
  DeviceExecutor e;
  e.launches_ =
      std::make_shared<const std::vector<internal::DeviceLaunch>>(internal::PlanDevice(program));
  e.program_ = std::move(program);
  return e;
}

int DeviceExecutor::launches() const { return static_cast<int>(launches_->size()); }

absl::Status DeviceExecutor::Run(absl::Span<const ConstBytes> inputs,
                                 absl::Span<const MutableBytes> outputs) const {
  std::string why;
  if (!DeviceAvailable(&why)) {
    return absl::FailedPreconditionError(absl::StrCat("DeviceExecutor::Run: ", why));
  }
#if PLEXUS_HAVE_CUDA
  const Program& p = program_;
  internal::BoundBuffers bound;
  const std::vector<bool> no_host_scratch(p.buffers.size(), false);
  PLEXUS_RETURN_IF_ERROR(internal::BindBuffers(p, inputs, outputs, &bound, &no_host_scratch));
  std::vector<cuda::DeviceBuffer> scratch;
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const BufferDecl& b = p.buffers[i];
    internal::Bound& m = bound.bufs[i];
    if (b.role != Role::kScratch) {
      if (!cuda::DeviceAddressable(m.read)) {
        return absl::InvalidArgumentError(absl::StrCat(
            std::string(RoleName(b.role)), " '", b.name,
            "' is not in memory the device can reach (device, managed or page-locked host "
            "memory)"));
      }
      continue;
    }
    const size_t bytes = static_cast<size_t>(b.count) * m.size;
    absl::StatusOr<cuda::DeviceBuffer> buf = cuda::DeviceBuffer::Allocate(bytes);
    if (!buf.ok()) {
      return absl::Status(buf.status().code(),
                          absl::StrCat("scratch '", b.name, "': ", buf.status().message()));
    }
    PLEXUS_RETURN_IF_ERROR(cuda::Zero(buf->data(), bytes));
    m.write = static_cast<uint8_t*>(buf->data());
    m.read = m.write;
    scratch.push_back(std::move(*buf));
  }
  constexpr unsigned kThreads = 256;
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the kernels stride over the rest
  for (const internal::DeviceLaunch& l : *launches_) {
    const Step& first = p.steps[l.steps.front()];
    absl::Status launched;
    if (l.steps.size() == 1) {
      internal::DeviceStepParams params = internal::StepParams(first, bound.bufs);
      uint8_t* dst = bound.bufs[first.dst.buffer].write;
      const uint8_t* src1 = bound.bufs[first.src1.buffer].read;
      const uint8_t* src2 =
          first.src2_kind == Operand2::kBuffer ? bound.bufs[first.src2.buffer].read : nullptr;
      const int64_t blocks =
          std::min<int64_t>((params.points + kThreads - 1) / kThreads, kMaxBlocks);
      void* args[] = {&params, &dst, &src1, &src2};
      launched =
          cuda::Launch({internal::kRestructureFatbin, "plexus::restructure kernels"},
                       "plexus_restructure_step", static_cast<unsigned>(blocks), kThreads, args);
    } else {
      internal::DeviceFusedParams params = internal::FusedParams(l, bound.bufs);
      const int64_t blocks =
          std::min<int64_t>((params.steps[0].points + kThreads - 1) / kThreads, kMaxBlocks);
      void* args[] = {&params};
      launched =
          cuda::Launch({internal::kRestructureFatbin, "plexus::restructure kernels"},
                       "plexus_restructure_fused", static_cast<unsigned>(blocks), kThreads, args);
    }
    if (!launched.ok()) {
      return absl::Status(launched.code(),
                          absl::StrCat("step ", l.steps.front(), " (",
                                       std::string(OpName(first.op)), "): ", launched.message()));
    }
  }
  return cuda::Synchronize();
#else
  (void)inputs;
  (void)outputs;
  return absl::FailedPreconditionError("DeviceExecutor::Run: Plexus was built without CUDA");
#endif
}

absl::StatusOr<std::unique_ptr<DeviceOutputStream>> DeviceOutputStream::Create(
    const DeviceExecutor& executor, std::vector<ConstBytes> inputs, MutableBytes staging) {
  const Program& p = executor.program();
  int output = -1, outputs = 0;
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    if (p.buffers[b].role == Role::kOutput && outputs++ == 0) output = static_cast<int>(b);
  }
  if (outputs != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DeviceOutputStream: the program has ", outputs, " outputs; a stream sends exactly one"));
  }
  const BufferDecl& out = p.buffers[output];
  std::unique_ptr<DeviceOutputStream> s(new DeviceOutputStream());
  s->bytes_ = static_cast<size_t>(out.count) * kernels::DataTypeSize(out.dtype);
  if (!staging.empty()) {
    if (staging.size() != s->bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("DeviceOutputStream: staging of ",
                                                     staging.size(), " bytes for output '",
                                                     out.name, "' of ", s->bytes_));
    }
    s->staging_ = staging.data();
  } else {
    absl::StatusOr<void*> pinned = base::cuda::AllocPinned(s->bytes_);
    if (!pinned.ok()) return pinned.status();
    s->staging_ = static_cast<uint8_t*>(*pinned);
    s->owned_ = true;
  }
  const MutableBytes whole(s->staging_, s->bytes_);
  PLEXUS_RETURN_IF_ERROR(executor.Run(inputs, absl::MakeConstSpan(&whole, 1)));
  return s;
}

DeviceOutputStream::~DeviceOutputStream() {
  if (owned_) base::cuda::FreePinned(staging_);
}

absl::Status DeviceOutputStream::Produce(size_t offset, absl::Span<uint8_t> out) {
  if (offset > bytes_ || out.size() > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("DeviceOutputStream::Produce: bytes [", offset, ", +",
                                              out.size(), ") of an output of ", bytes_));
  }
  if (!out.empty()) std::memcpy(out.data(), staging_ + offset, out.size());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceInputStream>> DeviceInputStream::Create(
    const DeviceExecutor& executor, int input, std::vector<ConstBytes> other_inputs,
    std::vector<MutableBytes> outputs) {
  const Program& p = executor.program();
  int in = -1, inputs = 0;
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    if (p.buffers[b].role == Role::kInput && inputs++ == input) in = static_cast<int>(b);
  }
  if (in < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceInputStream: input ", input, " of a program with ", inputs, " inputs"));
  }
  if (static_cast<int>(other_inputs.size()) != inputs - 1) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceInputStream: ", other_inputs.size(),
                                                   " other inputs given, the program has ",
                                                   inputs - 1));
  }
  std::unique_ptr<DeviceInputStream> s(new DeviceInputStream());
  s->executor_ = &executor;
  s->input_ = input;
  s->other_inputs_ = std::move(other_inputs);
  s->outputs_ = std::move(outputs);
  s->bytes_ = static_cast<size_t>(p.buffers[in].count) * kernels::DataTypeSize(p.buffers[in].dtype);
  absl::StatusOr<void*> staging = base::cuda::AllocPinned(s->bytes_);
  if (!staging.ok()) return staging.status();
  s->staging_ = static_cast<uint8_t*>(*staging);
  return s;
}

DeviceInputStream::~DeviceInputStream() { base::cuda::FreePinned(staging_); }

absl::Status DeviceInputStream::Consume(size_t offset, absl::Span<const uint8_t> in) {
  if (offset != consumed_ || in.size() > bytes_ - consumed_) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceInputStream::Consume: bytes [", offset,
                                                   ", +", in.size(), ") after ", consumed_,
                                                   " of an input of ", bytes_));
  }
  if (!in.empty()) std::memcpy(staging_ + offset, in.data(), in.size());
  consumed_ += in.size();
  return absl::OkStatus();
}

absl::Status DeviceInputStream::Finish() {
  if (consumed_ != bytes_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DeviceInputStream: ", bytes_ - consumed_, " of ", bytes_, " input bytes never arrived"));
  }
  std::vector<ConstBytes> inputs = other_inputs_;
  inputs.insert(inputs.begin() + input_, ConstBytes(staging_, bytes_));
  return executor_->Run(inputs, outputs_);
}

}  // namespace plexus::restructure
