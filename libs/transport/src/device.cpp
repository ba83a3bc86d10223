#include "plexus/transport/device.hpp"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/accept_loop.hpp"

namespace plexus::transport {

absl::StatusOr<std::shared_ptr<Device>> Device::Create(const DeviceOptions& options) {
  if (options.tcp.sockets_per_connection < 1 || options.tcp.sockets_per_connection > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp.sockets_per_connection must be in [1, 64], got ", options.tcp.sockets_per_connection));
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
  PathBinding path;
  path.local_address = std::string(local_address);
  return ConnectOnPath(path, address, cq);
}

absl::Status ValidatePathBinding(const PathBinding& binding, std::string_view what) {
  if (binding.flow_label > kMaxFlowLabel) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": flow_label ", binding.flow_label, " (0x",
                     absl::Hex(binding.flow_label), ") does not fit the GRH's 20 bits (at most 0x",
                     absl::Hex(kMaxFlowLabel), ")"));
  }
  if (binding.gid_index < -1 || binding.gid_index > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": gid_index ", binding.gid_index,
                     " is not a GID table index (0..255, or -1 for the GID of local_address)"));
  }
  return absl::OkStatus();
}

uint16_t RoceV2SourcePort(uint32_t flow_label) {
  const uint32_t low = flow_label & 0x3FFF;
  const uint32_t high = (flow_label & 0xFC000) >> 14;
  return static_cast<uint16_t>((low ^ high) | 0xC000);
}

absl::Status Device::RequireAddressOnly(const PathBinding& path, Backend backend) {
  PLEXUS_RETURN_IF_ERROR(ValidatePathBinding(path, "PathBinding"));
  if (path.gid_index != -1 || path.flow_label != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "PathBinding: the ", std::string(BackendName(backend)),
        " backend has no GID index or flow label (gid_index ", path.gid_index, ", flow_label ",
        path.flow_label, "); they apply to verbs only, leave them -1 and 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Connection>> Device::ConnectOnPath(const PathBinding& path,
                                                                  std::string_view address,
                                                                  CompletionQueue* cq) {
  PLEXUS_RETURN_IF_ERROR(RequireAddressOnly(path, backend()));
  if (path.local_address.empty() || path.local_address == options_.local_address) {
    return Connect(address, cq);
  }
  return absl::UnimplementedError(
      absl::StrCat("connection from ", path.local_address, " to ", std::string(address), ": the ",
                   std::string(BackendName(backend())),
                   " backend cannot choose a source address per connection; create one device per "
                   "DeviceOptions.local_address instead"));
}

absl::StatusOr<std::unique_ptr<Listener>> Device::ListenOnPath(const PathBinding& path,
                                                               std::string_view address) {
  PLEXUS_RETURN_IF_ERROR(RequireAddressOnly(path, backend()));
  if (address.empty() && !path.local_address.empty()) {
    return Listen(base::net::JoinHostPort(path.local_address, 0));
  }
  return Listen(address);
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
    base::WaitPolicy::Sleep(max_block);
  }
}

}  // namespace plexus::transport
