// MultipathDevice: transport::Device/Connection over MultipathChannels (device.hpp). Set-up runs
// over a control connection on path 0; the data paths go to listeners opened for one
// connection only, so concurrent connectors cannot exchange paths.
#include "plexus/multipath/device.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_set.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "channel_impl.hpp"
#include "plexus/base/status.hpp"

namespace plexus::multipath {

struct internal::DeviceRegistry {
  std::mutex mu;
  absl::flat_hash_set<MultipathChannel*> channels;
};

namespace {

using Registry = internal::DeviceRegistry;

namespace pt = ::plexus::transport;

const std::string kPrefix = "mp:";
const std::string kRequestMagic = "plexus-multipath/1 paths=";
const std::string kReplyOk = "ok ";
const std::string kReplyError = "error ";
constexpr size_t kControlBytes = 4096;  // largest set-up message either side accepts

bool IsIpv4(const std::string& text) {
  in_addr a;
  return inet_pton(AF_INET, text.c_str(), &a) == 1;
}

// "IP:PORT" with an IPv4 literal and a port in [0, 65535].
absl::Status CheckHostPort(const std::string& entry, const std::string& what) {
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ('", entry, "'): expected IP:PORT"));
  }
  if (!IsIpv4(entry.substr(0, colon))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ('", entry, "'): '", entry.substr(0, colon), "' is not an IPv4 address"));
  }
  int port = -1;
  if (!absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ('", entry, "'): port '",
                                                   entry.substr(colon + 1),
                                                   "' is not a number in [0, 65535]"));
  }
  return absl::OkStatus();
}

std::string HostOf(const std::string& host_port) {
  return host_port.substr(0, host_port.rfind(':'));
}

// Waits for the completion of `wr_id` on `cq` (a set-up queue with one connection).
absl::StatusOr<pt::Completion> AwaitControl(pt::CompletionQueue& cq, uint64_t wr_id,
                                            absl::Time deadline, const std::string& what) {
  for (;;) {
    absl::StatusOr<pt::Completion> c =
        cq.Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!c.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(what,
                                                      ": no answer within the connect "
                                                      "timeout"));
    }
    if (c->wr_id != wr_id) continue;
    if (!c->status.ok()) return base::Annotate(c->status, what);
    return c;
  }
}

// Waits until the channel has `paths` live paths (every hello arrived) or fails.
absl::Status AwaitLive(MultipathChannel& channel, int paths, absl::Time deadline,
                       const std::string& peer) {
  for (;;) {
    PLEXUS_RETURN_IF_ERROR(channel.status());
    if (channel.live_paths() == paths) return absl::OkStatus();
    if (absl::Now() > deadline) {
      std::string missing;
      for (const PathStats& p : channel.Stats().paths) {
        if (p.up) continue;
        absl::StrAppend(&missing, missing.empty() ? "" : ", ", "path ", p.index, " (", p.peer,
                        p.error.empty() ? ": no greeting" : absl::StrCat(": ", p.error), ")");
      }
      return absl::DeadlineExceededError(absl::StrCat("multipath set-up with ", peer, ": ", missing,
                                                      " not up within the connect timeout"));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

class MultipathConnection final : public pt::Connection {
 public:
  MultipathConnection(std::shared_ptr<pt::Device> inner, std::shared_ptr<Registry> registry)
      : inner_(std::move(inner)), registry_(std::move(registry)) {}
  ~MultipathConnection() override {
    if (channel_ != nullptr) {
      std::lock_guard<std::mutex> lock(registry_->mu);
      registry_->channels.erase(channel_.get());
    }
    channel_.reset();
  }

  // Creates the channel reporting to `cq` under this connection's id.
  absl::Status Init(const ChannelOptions& options, pt::CompletionQueue* cq) {
    internal::ChannelInternalOptions internal_options;
    internal_options.completion_id = id();
    internal_options.fail_when_all_paths_dead = true;
    PLEXUS_ASSIGN_OR_RETURN(channel_,
                            internal::ChannelFactory::Create(options, cq, internal_options));
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->channels.insert(channel_.get());
    return absl::OkStatus();
  }

  absl::Status AddPath(std::unique_ptr<pt::Connection> path) {
    peers_.push_back(path->peer_address());
    return channel_->AddPath(std::move(path)).status();
  }

  absl::Status PostSend(absl::Span<const pt::ConstBuffer> buffers, uint64_t wr_id) override {
    return channel_->Send(buffers, wr_id);
  }
  absl::Status PostRecv(pt::MutableBuffer buffer, uint64_t wr_id) override {
    return channel_->Recv(buffer, wr_id);
  }
  absl::Status PostWrite(const pt::MemoryRegion& local, size_t local_offset, size_t length,
                         const pt::RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override {
    return channel_->Write(local, local_offset, length, remote, remote_offset, immediate, wr_id);
  }
  void Close() override { channel_->Close(); }
  absl::Status status() const override { return channel_->status(); }
  std::string peer_address() const override {
    return absl::StrCat(kPrefix, absl::StrJoin(peers_, ","));
  }

  MultipathChannel* channel() { return channel_.get(); }

 private:
  std::shared_ptr<pt::Device> inner_;  // outlives the path connections
  std::shared_ptr<Registry> registry_;
  std::unique_ptr<MultipathChannel> channel_;
  std::vector<std::string> peers_;
};

class MultipathListener final : public pt::Listener {
 public:
  MultipathListener(std::shared_ptr<pt::Device> inner, std::shared_ptr<Registry> registry,
                    MultipathDeviceOptions options, std::unique_ptr<pt::Listener> control)
      : inner_(std::move(inner)),
        registry_(std::move(registry)),
        options_(std::move(options)),
        control_(std::move(control)) {
    std::vector<std::string> hosts = options_.local_addresses;
    address_ = absl::StrCat(kPrefix, control_->address());
    for (size_t k = 1; k < hosts.size(); ++k) absl::StrAppend(&address_, ",", hosts[k]);
  }

  std::string address() const override { return address_; }

  absl::StatusOr<std::unique_ptr<pt::Connection>> Accept(pt::CompletionQueue* cq,
                                                         absl::Duration timeout) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Accept: null completion queue");
    const int paths = static_cast<int>(options_.local_addresses.size());
    // The queue and the buffers outlive the control connection (declared first, destroyed
    // last): a post still outstanding when an error returns must not touch freed memory.
    pt::CompletionQueue control_cq;
    std::vector<char> request(kControlBytes);
    std::string reply;
    PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pt::Connection> control,
                            control_->Accept(&control_cq, timeout));
    const absl::Time deadline = absl::Now() + options_.device.connect_timeout;
    const std::string peer = control->peer_address();
    PLEXUS_RETURN_IF_ERROR(control->PostRecv({request.data(), request.size()}, 1));
    PLEXUS_ASSIGN_OR_RETURN(
        pt::Completion got,
        AwaitControl(control_cq, 1, deadline,
                     absl::StrCat("multipath set-up: waiting for the request of ", peer)));
    const std::string text(request.data(), got.bytes);
    int their_paths = 0;
    if (!absl::StartsWith(text, kRequestMagic) ||
        !absl::SimpleAtoi(text.substr(kRequestMagic.size()), &their_paths)) {
      return absl::InvalidArgumentError(absl::StrCat("multipath set-up: malformed request from ",
                                                     peer, " (not a MultipathDevice?)"));
    }
    if (their_paths != paths) {
      const std::string why = absl::StrCat(
          "the connector ", peer, " has ", their_paths, " paths, the listener ", address_, " has ",
          paths, " (MultipathDeviceOptions.local_addresses must have equal sizes)");
      reply = absl::StrCat(kReplyError, why);
      if (control->PostSend(pt::ConstBuffer{reply.data(), reply.size()}, 2).ok()) {
        (void)AwaitControl(control_cq, 2, deadline, "sending the refusal");
      }
      return absl::FailedPreconditionError(absl::StrCat("multipath set-up: ", why));
    }
    // One listener per path for this connection alone.
    std::vector<std::unique_ptr<pt::Listener>> listeners;
    std::vector<std::string> addresses;
    for (int k = 0; k < paths; ++k) {
      auto listener = inner_->Listen(absl::StrCat(options_.local_addresses[k], ":0"));
      if (!listener.ok()) {
        return base::Annotate(listener.status(),
                              absl::StrCat("multipath set-up: listening for path ", k, " on ",
                                           options_.local_addresses[k]));
      }
      addresses.push_back((*listener)->address());
      listeners.push_back(*std::move(listener));
    }
    reply = absl::StrCat(kReplyOk, absl::StrJoin(addresses, ","));
    PLEXUS_RETURN_IF_ERROR(control->PostSend(pt::ConstBuffer{reply.data(), reply.size()}, 2));
    auto conn = std::make_unique<MultipathConnection>(inner_, registry_);
    PLEXUS_RETURN_IF_ERROR(conn->Init(options_.channel, cq));
    MultipathChannel& channel = *conn->channel();
    for (int k = 0; k < paths; ++k) {
      auto path = listeners[k]->Accept(channel.path_queue(),
                                       std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (!path.ok()) {
        return base::Annotate(path.status(),
                              absl::StrCat("multipath set-up with ", peer, ": accepting path ", k,
                                           " on ", addresses[k]));
      }
      PLEXUS_RETURN_IF_ERROR(
          base::Annotate(conn->AddPath(*std::move(path)),
                         absl::StrCat("multipath set-up with ", peer, ": adding path ", k)));
    }
    PLEXUS_RETURN_IF_ERROR(AwaitLive(channel, paths, deadline, peer));
    control->Close();
    return std::unique_ptr<pt::Connection>(std::move(conn));
  }

 private:
  std::shared_ptr<pt::Device> inner_;
  std::shared_ptr<Registry> registry_;
  MultipathDeviceOptions options_;
  std::unique_ptr<pt::Listener> control_;
  std::string address_;
};

}  // namespace

absl::StatusOr<MultipathDevice::Address> MultipathDevice::ParseAddress(
    std::string_view address_view) {
  const std::string address(address_view);
  const auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("multipath address '", address, "': ", why,
                                                   " (expected mp:IP0:PORT,IP1,...,IPK-1)"));
  };
  if (!absl::StartsWith(address, kPrefix)) return fail("missing the 'mp:' prefix");
  const std::vector<std::string> entries = absl::StrSplit(address.substr(kPrefix.size()), ',');
  Address out;
  for (size_t k = 0; k < entries.size(); ++k) {
    const std::string& e = entries[k];
    if (e.empty()) return fail(absl::StrCat("entry ", k, " is empty"));
    if (k == 0) {
      if (absl::Status s = CheckHostPort(e, "entry 0"); !s.ok()) {
        return fail(std::string(s.message()));
      }
      out.control = e;
      out.hosts.push_back(HostOf(e));
      continue;
    }
    if (!IsIpv4(e)) {
      return fail(absl::StrCat("entry ", k, " ('", e, "') is not an IPv4 address"));
    }
    out.hosts.push_back(e);
  }
  return out;
}

MultipathChannel* MultipathDevice::ChannelOf(pt::Connection& connection) {
  auto* mp = dynamic_cast<MultipathConnection*>(&connection);
  return mp == nullptr ? nullptr : mp->channel();
}

absl::StatusOr<std::shared_ptr<MultipathDevice>> MultipathDevice::Create(
    const MultipathDeviceOptions& options) {
  if (options.local_addresses.empty()) {
    return absl::InvalidArgumentError(
        "MultipathDeviceOptions.local_addresses is empty: name the local IP of each path");
  }
  for (size_t k = 0; k < options.local_addresses.size(); ++k) {
    if (!IsIpv4(options.local_addresses[k])) {
      return absl::InvalidArgumentError(absl::StrCat("MultipathDeviceOptions.local_addresses[", k,
                                                     "] ('", options.local_addresses[k],
                                                     "') is not an IPv4 address"));
    }
  }
  if (options.device.backend != pt::Backend::kTcp) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultipathDeviceOptions.device.backend must be tcp, got ",
                     std::string(pt::BackendName(options.device.backend))));
  }
  if (options.device.progress != pt::ProgressMode::kThread) {
    return absl::InvalidArgumentError(
        "MultipathDeviceOptions.device.progress must be kThread (the channels consume the path "
        "completions in their own threads)");
  }
  // The channel options are checked the way every connection will create its channel.
  pt::CompletionQueue probe_cq;
  PLEXUS_RETURN_IF_ERROR(
      base::Annotate(MultipathChannel::Create(options.channel, &probe_cq).status(),
                     "MultipathDeviceOptions.channel"));
  pt::DeviceOptions inner_options = options.device;
  inner_options.local_address = options.local_addresses[0];
  PLEXUS_ASSIGN_OR_RETURN(std::shared_ptr<pt::Device> inner, pt::Device::Create(inner_options));
  return std::shared_ptr<MultipathDevice>(new MultipathDevice(options, std::move(inner)));
}

MultipathDevice::MultipathDevice(MultipathDeviceOptions options, std::shared_ptr<pt::Device> inner)
    : Device(inner->options()),
      options_(std::move(options)),
      inner_(std::move(inner)),
      registry_(std::make_shared<internal::DeviceRegistry>()) {}

std::vector<uint64_t> MultipathDevice::PathBytesAcked() const {
  std::vector<uint64_t> out(options_.local_addresses.size(), 0);
  std::lock_guard<std::mutex> lock(registry_->mu);
  for (const MultipathChannel* channel : registry_->channels) {
    for (const PathStats& p : channel->Stats().paths) {
      if (p.index >= 0 && static_cast<size_t>(p.index) < out.size()) out[p.index] += p.bytes_acked;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<pt::MemoryRegion>> MultipathDevice::Register(void* data,
                                                                            size_t bytes,
                                                                            pt::MemoryKind kind) {
  return inner_->Register(data, bytes, kind);
}

absl::StatusOr<std::unique_ptr<pt::Listener>> MultipathDevice::Listen(
    std::string_view address_view) {
  const std::string address(address_view);
  std::string control = absl::StrCat(options_.local_addresses[0], ":0");
  if (!address.empty()) {
    PLEXUS_ASSIGN_OR_RETURN(Address parsed, ParseAddress(address));
    if (parsed.hosts != options_.local_addresses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Listen '", address, "': the IPs must be this device's local_addresses in order (",
          absl::StrJoin(options_.local_addresses, ","), ")"));
    }
    control = parsed.control;
  }
  PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pt::Listener> listener, inner_->Listen(control));
  return std::unique_ptr<pt::Listener>(
      std::make_unique<MultipathListener>(inner_, registry_, options_, std::move(listener)));
}

absl::StatusOr<std::unique_ptr<pt::Connection>> MultipathDevice::Connect(
    std::string_view address_view, pt::CompletionQueue* cq) {
  const std::string address(address_view);
  if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
  PLEXUS_ASSIGN_OR_RETURN(Address parsed, ParseAddress(address));
  const int paths = this->paths();
  if (static_cast<int>(parsed.hosts.size()) != paths) {
    return absl::InvalidArgumentError(absl::StrCat(
        "multipath address '", address, "' names ", parsed.hosts.size(), " paths, this device has ",
        paths, " (MultipathDeviceOptions.local_addresses)"));
  }
  const absl::Time deadline = absl::Now() + options_.device.connect_timeout;
  // The queue and the buffers outlive the control connection (declared first, destroyed last).
  pt::CompletionQueue control_cq;
  std::vector<char> reply(kControlBytes);
  const std::string request = absl::StrCat(kRequestMagic, paths);
  auto control_or = inner_->ConnectFrom(options_.local_addresses[0], parsed.control, &control_cq);
  if (!control_or.ok()) {
    return base::Annotate(control_or.status(),
                          absl::StrCat("multipath set-up: control connection to ", parsed.control));
  }
  std::unique_ptr<pt::Connection> control = *std::move(control_or);
  PLEXUS_RETURN_IF_ERROR(control->PostRecv({reply.data(), reply.size()}, 1));
  PLEXUS_RETURN_IF_ERROR(control->PostSend(pt::ConstBuffer{request.data(), request.size()}, 2));
  PLEXUS_ASSIGN_OR_RETURN(
      pt::Completion got,
      AwaitControl(control_cq, 1, deadline,
                   absl::StrCat("multipath set-up: waiting for ", parsed.control, "'s answer")));
  const std::string text(reply.data(), got.bytes);
  if (absl::StartsWith(text, kReplyError)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "multipath set-up: ", parsed.control, " refused: ", text.substr(kReplyError.size())));
  }
  std::vector<std::string> addresses;
  if (absl::StartsWith(text, kReplyOk)) {
    addresses = absl::StrSplit(text.substr(kReplyOk.size()), ',');
  }
  bool well_formed = static_cast<int>(addresses.size()) == paths;
  for (size_t k = 0; well_formed && k < addresses.size(); ++k) {
    well_formed =
        CheckHostPort(addresses[k], "path").ok() && HostOf(addresses[k]) == parsed.hosts[k];
  }
  if (!well_formed) {
    return absl::DataLossError(absl::StrCat(
        "multipath set-up: malformed answer from ", parsed.control, " ('", text.substr(0, 200),
        "'): expected ", paths, " paths on ", absl::StrJoin(parsed.hosts, ",")));
  }
  auto conn = std::make_unique<MultipathConnection>(inner_, registry_);
  PLEXUS_RETURN_IF_ERROR(conn->Init(options_.channel, cq));
  MultipathChannel& channel = *conn->channel();
  for (int k = 0; k < paths; ++k) {
    auto path =
        inner_->ConnectFrom(options_.local_addresses[k], addresses[k], channel.path_queue());
    if (!path.ok()) {
      return base::Annotate(path.status(),
                            absl::StrCat("multipath set-up: path ", k, " from ",
                                         options_.local_addresses[k], " to ", addresses[k]));
    }
    PLEXUS_RETURN_IF_ERROR(base::Annotate(conn->AddPath(*std::move(path)),
                                          absl::StrCat("multipath set-up: adding path ", k)));
  }
  PLEXUS_RETURN_IF_ERROR(AwaitLive(channel, paths, deadline, parsed.control));
  control->Close();
  return std::unique_ptr<pt::Connection>(std::move(conn));
}

absl::StatusOr<std::unique_ptr<pt::Connection>> MultipathDevice::ConnectFrom(
    std::string_view local_address, std::string_view address, pt::CompletionQueue* cq) {
  if (!local_address.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "MultipathDevice::ConnectFrom ", std::string(local_address),
        ": the paths' sources are MultipathDeviceOptions.local_addresses; use Connect"));
  }
  return Connect(address, cq);
}

}  // namespace plexus::multipath
