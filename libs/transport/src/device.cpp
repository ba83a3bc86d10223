#include "plexus/transport/device.hpp"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends.hpp"
#include "plexus/transport/accept_loop.hpp"

namespace plexus::transport {

absl::StatusOr<std::shared_ptr<Device>> Device::Create(const DeviceOptions& options) {
  if (options.sockets_per_connection < 1 || options.sockets_per_connection > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sockets_per_connection must be in [1, 64], got ", options.sockets_per_connection));
  }
  if (options.op_timeout <= absl::ZeroDuration() ||
      options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("op_timeout and connect_timeout must be positive");
  }
  switch (options.backend) {
    case Backend::kInproc:
      return internal::CreateInprocDevice(options);
    case Backend::kShm:
      return internal::CreateShmDevice(options);
    case Backend::kTcp:
      return internal::CreateTcpDevice(options);
    case Backend::kVerbs:
      return internal::CreateVerbsDevice(options);
  }
  return absl::InvalidArgumentError("unknown backend");
}

bool Device::Available(Backend backend, std::string* why_not) {
  if (backend == Backend::kVerbs) return internal::VerbsAvailable(why_not);
  return true;
}

absl::StatusOr<std::unique_ptr<Connection>> Device::ConnectFrom(std::string_view local_address,
                                                                std::string_view address,
                                                                CompletionQueue* cq) {
  if (local_address.empty() || local_address == options_.local_address) {
    return Connect(address, cq);
  }
  return absl::UnimplementedError(
      absl::StrCat("ConnectFrom ", std::string(local_address), " to ", std::string(address),
                   ": the ", std::string(BackendName(backend())),
                   " backend cannot choose a source address per connection; create one device per "
                   "DeviceOptions.local_address instead"));
}

void AcceptUntil(Listener& listener, const std::atomic<bool>& stop, CompletionQueue* cq,
                 absl::FunctionRef<void(std::unique_ptr<Connection>)> on_connection) {
  while (!stop.load()) {
    absl::StatusOr<std::unique_ptr<Connection>> conn = listener.Accept(cq, absl::Milliseconds(100));
    if (conn.ok()) {
      on_connection(*std::move(conn));
    } else if (!absl::IsDeadlineExceeded(conn.status()) && !stop.load()) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
}

std::unique_ptr<CompletionQueue> Device::CreateCompletionQueue() {
  return std::make_unique<CompletionQueue>(options_.progress == ProgressMode::kCaller ? this
                                                                                      : nullptr);
}

void Device::Progress(absl::Duration max_block) {
  if (options_.progress == ProgressMode::kCaller) {
    DriveProgress(max_block);
  } else if (max_block > absl::ZeroDuration()) {
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(max_block));
  }
}

}  // namespace plexus::transport
