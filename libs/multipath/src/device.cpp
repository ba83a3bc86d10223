// MultipathDevice: transport::Device/Connection over MultipathChannels (device.hpp). Set-up runs
// over a control connection on path 0; the data paths go to listeners opened for one
// connection only, so concurrent connectors cannot exchange paths.
#include "plexus/multipath/device.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "channel_impl.hpp"
#include "channel_test_access.hpp"
#include "device_wire.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"

namespace plexus::multipath {

struct internal::DeviceRegistry {
  std::mutex mu;
  absl::flat_hash_set<MultipathChannel*> channels;
};

namespace {

using Registry = internal::DeviceRegistry;

namespace pt = ::plexus::transport;

using internal::kSetupMessageBytes;

// How long a set-up wait blocks before it checks whether the peer gave up.
constexpr absl::Duration kSetupSlice = absl::Milliseconds(50);

std::mutex hooks_mu;
internal::DeviceTestHooks* hooks = nullptr;  // guarded by hooks_mu

void RunHook(std::function<void(MultipathChannel&)> internal::DeviceTestHooks::*which,
             MultipathChannel& channel) {
  std::function<void(MultipathChannel&)> hook;
  {
    std::lock_guard<std::mutex> lock(hooks_mu);
    if (hooks != nullptr) hook = hooks->*which;
  }
  if (hook) hook(channel);
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

// The default flow labels of a new connection's paths: drawn per connection, so that the
// connections of a device spread over ECMP routes as well as their paths.
std::vector<uint32_t> NewDefaultLabels(int paths) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t base = absl::Uniform<uint64_t>(absl::BitGen());
  return DefaultFlowLabels(paths, base + counter.fetch_add(1, std::memory_order_relaxed));
}

// Each lane whose peer's hello has not arrived yet, with why ("" when every lane was greeted).
// A lane counts once greeted even if its path died since: the dead path is then the channel's
// to revive (or to leave dead), exactly as if it had died a moment after set-up.
std::string UngreetedLanes(const MultipathChannel& channel, int paths) {
  std::vector<bool> greeted(static_cast<size_t>(paths), false);
  const ChannelStats stats = channel.Stats();
  for (const PathStats& p : stats.paths) {
    if (p.greeted && p.lane >= 0 && p.lane < paths) greeted[static_cast<size_t>(p.lane)] = true;
  }
  std::string missing;
  for (const PathStats& p : stats.paths) {
    if (p.lane < 0 || p.lane >= paths || greeted[static_cast<size_t>(p.lane)]) continue;
    greeted[static_cast<size_t>(p.lane)] = true;  // named once
    absl::StrAppend(&missing, missing.empty() ? "" : ", ", "path ", p.index, " (", p.peer,
                    p.error.empty() ? ": no greeting" : absl::StrCat(": ", p.error), ")");
  }
  return missing;
}

// The set-up's last exchange on the control connection. Once a side has tried to bring its
// paths up it sends its verdict (ready, or why not) and waits for the peer's; it returns OK only
// when both are ready, so that set-up succeeds on both sides or fails on both. A side that fails
// earlier closes the control connection, which the other notices at once (it polls for the
// peer's verdict while it waits for its paths).
class SetupVerdicts {
 public:
  // `buffer` receives the peer's verdict: like the queue, it must outlive the control connection
  // (declared before it), since a receive posted into it may complete while the connection closes.
  SetupVerdicts(pt::Connection& control, pt::CompletionQueue& cq, std::vector<char>& buffer,
                std::string& mine, std::string peer)
      : control_(control), cq_(cq), peer_(std::move(peer)), buffer_(buffer), mine_(mine) {}

  absl::Status PostRecv() { return control_.PostRecv({buffer_.data(), buffer_.size()}, kRecv); }

  // Without blocking: whether the peer's verdict (or the control connection's failure) is in.
  bool Arrived() {
    pt::Completion batch[4];
    const size_t n = cq_.Poll(absl::MakeSpan(batch));
    for (size_t i = 0; i < n; ++i) Take(batch[i]);
    return theirs_.has_value();
  }

  // The peer's verdict by `deadline`: OK when it is ready, else an error naming its reason.
  absl::Status Theirs(absl::Time deadline) {
    while (!Arrived()) {
      absl::StatusOr<pt::Completion> c =
          cq_.Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (!c.ok()) {
        return absl::DeadlineExceededError(
            absl::StrCat("multipath set-up with ", peer_,
                         ": its verdict did not come within the connect "
                         "timeout"));
      }
      Take(*c);
    }
    return *theirs_;
  }

  // Sends this side's verdict and waits until it left (a close right after must not drop it).
  absl::Status Send(const absl::Status& mine, absl::Time deadline) {
    mine_ = mine.ok() ? internal::EncodeSetupReady() : internal::EncodeSetupFailed(mine.ToString());
    PLEXUS_RETURN_IF_ERROR(control_.PostSend(pt::ConstBuffer{mine_.data(), mine_.size()}, kSend));
    while (!sent_) {
      absl::StatusOr<pt::Completion> c =
          cq_.Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (!c.ok()) {
        return absl::DeadlineExceededError(absl::StrCat("multipath set-up with ", peer_,
                                                        ": sending this side's verdict timed out"));
      }
      Take(*c);
      if (theirs_.has_value() && !theirs_->ok() && !sent_) break;  // the control link is gone
    }
    return absl::OkStatus();
  }

 private:
  static constexpr uint64_t kRecv = 10, kSend = 11;

  void Take(const pt::Completion& c) {
    if (c.wr_id == kSend) {
      sent_ = true;
      if (!c.status.ok() && !theirs_.has_value()) theirs_ = Gone(c.status);
      return;
    }
    if (c.wr_id != kRecv || theirs_.has_value()) return;
    if (!c.status.ok()) {
      theirs_ = Gone(c.status);
      return;
    }
    absl::StatusOr<internal::SetupVerdict> v =
        internal::ParseSetupVerdict(std::string_view(buffer_.data(), c.bytes));
    if (!v.ok()) {
      theirs_ = base::Annotate(v.status(), absl::StrCat("multipath set-up with ", peer_));
    } else if (v->ready) {
      theirs_ = absl::OkStatus();
    } else {
      theirs_ = absl::UnavailableError(
          absl::StrCat("multipath set-up: the peer ", peer_, " failed: ", v->why));
    }
  }

  absl::Status Gone(const absl::Status& why) const {
    return absl::UnavailableError(absl::StrCat("multipath set-up: the peer ", peer_,
                                               " gave up (control connection: ", why.message(),
                                               ")"));
  }

  pt::Connection& control_;
  pt::CompletionQueue& cq_;
  const std::string peer_;
  std::vector<char>& buffer_;
  std::string& mine_;  // this side's verdict, being sent (outlives the connection too)
  bool sent_ = false;
  std::optional<absl::Status> theirs_;
};

// Waits until every lane was greeted, the channel failed, or the peer's verdict came (a
// failure: set-up is over; ready: this side keeps waiting for its own paths).
absl::Status AwaitGreeted(MultipathChannel& channel, int paths, absl::Time deadline,
                          const std::string& peer, SetupVerdicts& verdicts) {
  bool peer_failed = false;
  const bool ended = base::PollUntil(deadline, absl::Microseconds(200), [&] {
    if (verdicts.Arrived() && !verdicts.Theirs(absl::Now()).ok()) peer_failed = true;
    return peer_failed || !channel.status().ok() || UngreetedLanes(channel, paths).empty();
  });
  if (peer_failed) return verdicts.Theirs(absl::Now());
  if (absl::Status failed = channel.status(); !failed.ok()) {
    // This side's paths failing is often the peer giving up; its verdict, when it comes at
    // once, names the cause.
    base::PollUntil(std::min(deadline, absl::Now() + absl::Milliseconds(200)),
                    absl::Microseconds(200), [&] { return verdicts.Arrived(); });
    if (verdicts.Arrived() && !verdicts.Theirs(absl::Now()).ok())
      return verdicts.Theirs(absl::Now());
    return base::Annotate(failed, absl::StrCat("multipath set-up with ", peer));
  }
  const std::string missing = UngreetedLanes(channel, paths);
  if (ended && missing.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("multipath set-up with ", peer, ": ", missing,
                                                  " not up within the connect timeout"));
}

// This side's verdict out, the peer's in: OK only when both are ready. On an error the peer
// learns it from this side's verdict (or from the control connection closing).
absl::Status Conclude(absl::Status mine, SetupVerdicts& verdicts, absl::Time deadline) {
  // The verdict leaves even after the deadline passed (a short grace), so the peer hears why.
  const absl::Time send_by = std::max(deadline, absl::Now() + absl::Milliseconds(500));
  absl::Status sent = verdicts.Send(mine, send_by);
  PLEXUS_RETURN_IF_ERROR(mine);
  PLEXUS_RETURN_IF_ERROR(sent);
  return verdicts.Theirs(deadline);
}

// A set-up step's status; on an error, the peer is told why before it returns.
absl::Status Step(absl::Status status, SetupVerdicts& verdicts, absl::Time deadline) {
  if (status.ok()) return status;
  return Conclude(std::move(status), verdicts, deadline);
}

class MultipathConnection final : public pt::Connection {
 public:
  MultipathConnection(std::shared_ptr<pt::Device> inner, std::shared_ptr<Registry> registry)
      : inner_(std::move(inner)), registry_(std::move(registry)) {}
  ~MultipathConnection() override {
    closing_ = true;
    if (channel_ != nullptr) {
      std::lock_guard<std::mutex> lock(registry_->mu);
      registry_->channels.erase(channel_.get());
    }
    channel_.reset();
  }

  // How this side re-establishes a dead path k (MultipathDeviceOptions::revive_paths): the
  // connector dials its local_addresses[k] -> the listener's path-k address again; the
  // listener accepts on the path-k listener it keeps for this connection.
  struct Redial {
    std::vector<pt::PathBinding> bindings;                 // connector: path k's source
    std::vector<std::string> remote_addresses;             // connector: path k's listener
    std::vector<std::unique_ptr<pt::Listener>> listeners;  // listener
  };

  // Creates the channel reporting to `cq` under this connection's id; with `redial`, the
  // channel revives dead paths by itself.
  absl::Status Init(ChannelOptions options, pt::CompletionQueue* cq, std::optional<Redial> redial) {
    internal::ChannelInternalOptions internal_options;
    internal_options.completion_id = id();
    internal_options.fail_when_all_paths_dead = true;
    options.redial = nullptr;
    if (redial.has_value()) {
      redial_ = std::move(*redial);
      max_accept_wait_ = options.max_reconnect_backoff;
      // The channel (and its revival thread) goes before this object's other members.
      options.redial = [this](int lane) { return RedialPath(lane); };
    }
    PLEXUS_ASSIGN_OR_RETURN(channel_,
                            internal::ChannelFactory::Create(options, cq, internal_options));
    {
      // RedialPath uses this, not channel_: unique_ptr::reset nulls channel_ before the
      // channel's destructor joins the revival thread.
      std::lock_guard<std::mutex> lock(redial_mu_);
      path_queue_ = channel_->path_queue();
    }
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
  // Also closes the path listeners kept for revival (after a running accept's slice, at most
  // kAcceptSlice), so that a peer redialing a path is refused at once instead of waiting for
  // its connect timeout.
  void Close() override {
    closing_ = true;
    channel_->Close();
    // remote_addresses is set before the channel exists and never changes: a connector (which
    // may be in a connect, holding redial_mu_) has no listeners to close.
    if (!redial_.remote_addresses.empty()) return;
    std::lock_guard<std::mutex> lock(redial_mu_);
    redial_.listeners.clear();
  }
  absl::Status status() const override { return channel_->status(); }
  std::string peer_address() const override {
    return absl::StrCat("mp:", absl::StrJoin(peers_, ","));
  }

  MultipathChannel* channel() { return channel_.get(); }
  // The listener side's path listeners, kept for revival.
  void KeepListeners(std::vector<std::unique_ptr<pt::Listener>> listeners) {
    std::lock_guard<std::mutex> lock(redial_mu_);
    redial_.listeners = std::move(listeners);
  }

 private:
  // Runs in the channel's revival thread.
  absl::StatusOr<std::unique_ptr<pt::Connection>> RedialPath(int lane) {
    std::lock_guard<std::mutex> lock(redial_mu_);
    const size_t k = static_cast<size_t>(lane);
    if (k < redial_.remote_addresses.size()) {
      // The same binding: a redialed path keeps its source, GID and flow label.
      auto conn =
          inner_->ConnectOnPath(redial_.bindings[k], redial_.remote_addresses[k], path_queue_);
      if (conn.ok()) return conn;
      return base::Annotate(conn.status(), absl::StrCat("multipath: redialing path ", k, " from ",
                                                        redial_.bindings[k].local_address, " to ",
                                                        redial_.remote_addresses[k]));
    }
    if (k < redial_.listeners.size()) {
      // Bounded, and in short slices, so that Close and the destructor do not wait long.
      const absl::Time deadline = absl::Now() + max_accept_wait_;
      absl::StatusOr<std::unique_ptr<pt::Connection>> conn;
      do {
        const absl::Duration slice = std::min(kAcceptSlice, deadline - absl::Now());
        conn = redial_.listeners[k]->Accept(path_queue_, std::max(slice, absl::ZeroDuration()));
      } while (!conn.ok() && absl::IsDeadlineExceeded(conn.status()) && !closing_.load() &&
               absl::Now() < deadline);
      if (conn.ok()) return conn;
      return base::Annotate(
          conn.status(), absl::StrCat("multipath: waiting for the peer to redial path ", k, " on ",
                                      redial_.listeners[k]->address()));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("multipath: no path ", k, " to revive (", redial_.remote_addresses.size(),
                     " dial targets, ", redial_.listeners.size(), " listeners)"));
  }

  std::shared_ptr<pt::Device> inner_;  // outlives the path connections
  std::shared_ptr<Registry> registry_;
  static constexpr absl::Duration kAcceptSlice = absl::Milliseconds(50);
  std::atomic<bool> closing_{false};
  std::mutex redial_mu_;
  Redial redial_;
  pt::CompletionQueue* path_queue_ = nullptr;  // the channel's (guarded by redial_mu_)
  absl::Duration max_accept_wait_ = absl::Seconds(1);
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
    address_ = absl::StrCat("mp:", control_->address());
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
    std::vector<char> request(kSetupMessageBytes), their_verdict(kSetupMessageBytes);
    std::string reply, my_verdict;
    PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<pt::Connection> control,
                            control_->Accept(&control_cq, timeout));
    const absl::Time deadline = absl::Now() + options_.device.connect_timeout;
    const std::string peer = control->peer_address();
    PLEXUS_RETURN_IF_ERROR(control->PostRecv({request.data(), request.size()}, 1));
    PLEXUS_ASSIGN_OR_RETURN(
        pt::Completion got,
        AwaitControl(control_cq, 1, deadline,
                     absl::StrCat("multipath set-up: waiting for the request of ", peer)));
    auto their_paths_or = internal::ParseSetupRequest(std::string(request.data(), got.bytes));
    if (!their_paths_or.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("multipath set-up: malformed request from ",
                                                     peer, " (not a MultipathDevice?)"));
    }
    const int their_paths = *their_paths_or;
    if (their_paths != paths) {
      const std::string why = absl::StrCat(
          "the connector ", peer, " has ", their_paths, " paths, the listener ", address_, " has ",
          paths, " (MultipathDeviceOptions.local_addresses must have equal sizes)");
      reply = internal::EncodeSetupRefusal(why);
      if (control->PostSend(pt::ConstBuffer{reply.data(), reply.size()}, 2).ok()) {
        (void)AwaitControl(control_cq, 2, deadline, "sending the refusal");
      }
      return absl::FailedPreconditionError(absl::StrCat("multipath set-up: ", why));
    }
    // One listener per path for this connection alone; its accepted path (and a redialed one)
    // takes the path's binding (verbs: GID index, flow label).
    const std::vector<pt::PathBinding> bindings = PathBindings(options_, NewDefaultLabels(paths));
    std::vector<std::unique_ptr<pt::Listener>> listeners;
    std::vector<std::string> addresses;
    for (int k = 0; k < paths; ++k) {
      auto listener = inner_->ListenOnPath(bindings[k], "");
      if (!listener.ok()) {
        return base::Annotate(listener.status(),
                              absl::StrCat("multipath set-up: listening for path ", k, " on ",
                                           options_.local_addresses[k]));
      }
      addresses.push_back((*listener)->address());
      listeners.push_back(*std::move(listener));
    }
    reply = internal::EncodeSetupAccept(addresses);
    SetupVerdicts verdicts(*control, control_cq, their_verdict, my_verdict, peer);
    PLEXUS_RETURN_IF_ERROR(verdicts.PostRecv());
    PLEXUS_RETURN_IF_ERROR(control->PostSend(pt::ConstBuffer{reply.data(), reply.size()}, 2));
    auto conn = std::make_unique<MultipathConnection>(inner_, registry_);
    std::optional<MultipathConnection::Redial> redial;
    if (options_.revive_paths) redial.emplace();  // the listeners join it once set up
    PLEXUS_RETURN_IF_ERROR(
        Step(conn->Init(options_.channel, cq, std::move(redial)), verdicts, deadline));
    MultipathChannel& channel = *conn->channel();
    for (int k = 0; k < paths; ++k) {
      // In slices, so that a connector that gave up is noticed at once, not at the deadline.
      absl::StatusOr<std::unique_ptr<pt::Connection>> path;
      do {
        const absl::Duration slice = std::min(kSetupSlice, deadline - absl::Now());
        path = listeners[k]->Accept(channel.path_queue(), std::max(slice, absl::ZeroDuration()));
      } while (!path.ok() && absl::IsDeadlineExceeded(path.status()) && !verdicts.Arrived() &&
               absl::Now() < deadline);
      if (!path.ok()) {
        if (verdicts.Arrived()) PLEXUS_RETURN_IF_ERROR(verdicts.Theirs(absl::Now()));
        return Step(base::Annotate(path.status(),
                                   absl::StrCat("multipath set-up with ", peer, ": accepting path ",
                                                k, " on ", addresses[k])),
                    verdicts, deadline);
      }
      PLEXUS_RETURN_IF_ERROR(
          Step(base::Annotate(conn->AddPath(*std::move(path)),
                              absl::StrCat("multipath set-up with ", peer, ": adding path ", k)),
               verdicts, deadline));
    }
    RunHook(&internal::DeviceTestHooks::listener_accepted, channel);
    PLEXUS_RETURN_IF_ERROR(
        Conclude(AwaitGreeted(channel, paths, deadline, peer, verdicts), verdicts, deadline));
    control->Close();
    if (options_.revive_paths) conn->KeepListeners(std::move(listeners));
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

absl::StatusOr<MultipathDevice::Address> MultipathDevice::ParseAddress(std::string_view address) {
  return internal::ParseCompositeAddress(address);
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
    if (!base::net::IsIpLiteral(options.local_addresses[k])) {
      return absl::InvalidArgumentError(absl::StrCat("MultipathDeviceOptions.local_addresses[", k,
                                                     "] ('", options.local_addresses[k],
                                                     "') is not an IP address"));
    }
  }
  if (options.device.backend != pt::Backend::kTcp &&
      options.device.backend != pt::Backend::kVerbs) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultipathDeviceOptions.device.backend must be tcp or verbs, got ",
                     std::string(pt::BackendName(options.device.backend))));
  }
  PLEXUS_RETURN_IF_ERROR(internal::ValidatePathOptions(options));
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

pt::Backend MultipathDevice::backend() const { return inner_->backend(); }

std::vector<uint64_t> MultipathDevice::PathBytesAcked() const {
  std::vector<uint64_t> out(options_.local_addresses.size(), 0);
  std::lock_guard<std::mutex> lock(registry_->mu);
  for (const MultipathChannel* channel : registry_->channels) {
    for (const PathStats& p : channel->Stats().paths) {
      if (p.lane >= 0 && static_cast<size_t>(p.lane) < out.size()) out[p.lane] += p.bytes_acked;
    }
  }
  return out;
}

std::vector<ChannelStats> MultipathDevice::Stats() const {
  std::vector<ChannelStats> out;
  std::lock_guard<std::mutex> lock(registry_->mu);
  for (const MultipathChannel* channel : registry_->channels) out.push_back(channel->Stats());
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
  std::string control = base::net::JoinHostPort(options_.local_addresses[0], 0);
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
  std::vector<char> reply(kSetupMessageBytes), their_verdict(kSetupMessageBytes);
  std::string my_verdict;
  const std::string request = internal::EncodeSetupRequest(paths);
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
  auto answer = internal::ParseSetupReply(std::string(reply.data(), got.bytes), parsed.hosts);
  if (!answer.ok()) {
    return base::Annotate(answer.status(), absl::StrCat("multipath set-up: from ", parsed.control));
  }
  if (answer->refused) {
    return absl::FailedPreconditionError(
        absl::StrCat("multipath set-up: ", parsed.control, " refused: ", answer->why));
  }
  const std::vector<std::string>& addresses = answer->addresses;
  SetupVerdicts verdicts(*control, control_cq, their_verdict, my_verdict, parsed.control);
  PLEXUS_RETURN_IF_ERROR(verdicts.PostRecv());
  auto conn = std::make_unique<MultipathConnection>(inner_, registry_);
  std::optional<MultipathConnection::Redial> redial;
  const std::vector<pt::PathBinding> bindings = PathBindings(options_, NewDefaultLabels(paths));
  if (options_.revive_paths) {
    redial.emplace();
    redial->bindings = bindings;
    redial->remote_addresses = addresses;
  }
  PLEXUS_RETURN_IF_ERROR(
      Step(conn->Init(options_.channel, cq, std::move(redial)), verdicts, deadline));
  MultipathChannel& channel = *conn->channel();
  for (int k = 0; k < paths; ++k) {
    auto path = inner_->ConnectOnPath(bindings[k], addresses[k], channel.path_queue());
    if (!path.ok()) {
      return Step(base::Annotate(path.status(),
                                 absl::StrCat("multipath set-up: path ", k, " from ",
                                              options_.local_addresses[k], " to ", addresses[k])),
                  verdicts, deadline);
    }
    PLEXUS_RETURN_IF_ERROR(Step(base::Annotate(conn->AddPath(*std::move(path)),
                                               absl::StrCat("multipath set-up: adding path ", k)),
                                verdicts, deadline));
  }
  absl::Status mine = AwaitGreeted(channel, paths, deadline, parsed.control, verdicts);
  if (mine.ok()) RunHook(&internal::DeviceTestHooks::connector_greeted, channel);
  PLEXUS_RETURN_IF_ERROR(Conclude(std::move(mine), verdicts, deadline));
  control->Close();
  return std::unique_ptr<pt::Connection>(std::move(conn));
}

void internal::SetDeviceTestHooks(DeviceTestHooks h) {
  std::lock_guard<std::mutex> lock(hooks_mu);
  static DeviceTestHooks installed;
  installed = std::move(h);
  hooks = &installed;
}

namespace {

absl::Status RequireEmptyBinding(const pt::PathBinding& path, std::string_view call) {
  if (path.local_address.empty() && path.gid_index == -1 && path.flow_label == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "MultipathDevice::", std::string(call), ": a multipath connection binds each of its paths ",
      "itself (MultipathDeviceOptions.local_addresses and path_options); pass an empty "
      "PathBinding"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<pt::Connection>> MultipathDevice::ConnectOnPath(
    const pt::PathBinding& path, std::string_view address, pt::CompletionQueue* cq) {
  PLEXUS_RETURN_IF_ERROR(RequireEmptyBinding(path, "ConnectOnPath"));
  return Connect(address, cq);
}

absl::StatusOr<std::unique_ptr<pt::Listener>> MultipathDevice::ListenOnPath(
    const pt::PathBinding& path, std::string_view address) {
  PLEXUS_RETURN_IF_ERROR(RequireEmptyBinding(path, "ListenOnPath"));
  return Listen(address);
}

}  // namespace plexus::multipath
