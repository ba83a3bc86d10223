// The shm backend: processes of one host, connected through a shared-memory file of two
// single-producer single-consumer byte rings; bulk bytes move by cross-memory attach.
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backends.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "region_registry.hpp"
#include "shm/connection_state.hpp"
#include "shm/session.hpp"
#include "shm/stats.hpp"

namespace plexus::transport::internal {
namespace shm {
namespace {

const base::Param<bool> kShmCmaParam("PLEXUS_SHM_CMA", true,
                                     "shm bulk messages by cross-memory attach when permitted");
const base::Param<base::Bytes> kShmCmaThresholdParam(
    "PLEXUS_SHM_CMA_THRESHOLD", base::Bytes{0},
    "shm messages from this size go by cross-memory attach (0: the backend's default)");
const base::Param<base::Bytes> kShmExchangeCmaThresholdParam(
    "PLEXUS_SHM_EXCHANGE_CMA_THRESHOLD", base::Bytes{0},
    "shm messages from this size go by cross-memory attach when the sender's own posted "
    "receives on the connection are as large (0: the backend's default)");
const base::Param<base::Bytes> kShmLoneCmaThresholdParam(
    "PLEXUS_SHM_LONE_CMA_THRESHOLD", base::Bytes{0},
    "shm messages from this size go by cross-memory attach when nothing else is queued or "
    "unacknowledged on the connection (0: off)");

// Spinning covers a round trip between two processes (waking a sleeping CPU takes tens of
// microseconds in a VM; docs/measurements/transport.md, "Figures first recorded in code
// comments"); after that the progress loop sleeps on its doorbell futex.
constexpr absl::Duration kSpinBeforeSleep = absl::Microseconds(100);
// Longest sleep between liveness checks of the peers' sockets.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(10);
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(5);

// A size threshold of ShmOptions: the option (0: unset) beats the environment's `param`; a
// result of 0 leaves `*out` at the backend's default.
absl::Status ResolveThreshold(const base::Param<base::Bytes>& param, size_t option, size_t* out) {
  std::optional<base::Bytes> explicit_value;
  if (option > 0) explicit_value = base::Bytes{option};
  PLEXUS_ASSIGN_OR_RETURN(const base::Bytes resolved, param.Resolve(explicit_value));
  if (resolved.value > 0) *out = resolved.value;
  return absl::OkStatus();
}

size_t RoundUpPowerOfTwo(size_t v) {
  size_t p = kMinRingBytes;
  while (p < v && p < kMaxRingBytes) p <<= 1;
  return p;
}

class ShmDevice;

class ShmConnection final : public Connection {
 public:
  ShmConnection(std::shared_ptr<ShmDevice> device, std::shared_ptr<ConnectionState> state);
  ~ShmConnection() override { Close(); }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) override {
    return state_->PostSend(buffers, wr_id);
  }
  absl::StatusOr<std::optional<size_t>> PeekNext(MutableBuffer head) override {
    return state_->PeekNext(head);
  }
  absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id) override {
    return state_->PostSendProduced(length, std::move(producer), wr_id);
  }
  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) override {
    return state_->PostRecvConsumed(max_length, std::move(consumer), wr_id);
  }
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) override {
    return state_->PostRecv(buffer, wr_id);
  }
  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override {
    return state_->PostWrite(local, local_offset, length, remote, remote_offset, immediate, wr_id);
  }
  void Close() override;
  absl::Status status() const override { return state_->status(); }
  std::string peer_address() const override { return state_->peer_address(); }
  ConnectionStats stats() const { return state_->stats(); }
  Mailbox* mailbox() override { return state_->mailbox(); }

 private:
  std::shared_ptr<ShmDevice> device_;
  std::shared_ptr<ConnectionState> state_;
  std::once_flag closed_;
};

class ShmDevice final : public Device, public std::enable_shared_from_this<ShmDevice> {
 public:
  explicit ShmDevice(const DeviceOptions& options)
      : Device(options), registry_(std::make_shared<RegionRegistry>(Backend::kShm)) {}

  ~ShmDevice() override {
    stop_.store(true);
    if (thread_.joinable()) {
      doorbell_.bell.Ring();
      thread_.join();
    }
  }

  absl::Status Init() {
    PLEXUS_ASSIGN_OR_RETURN(auto bell, CreateDoorbell());
    doorbell_ = std::move(bell);
    ring_bytes_ = RoundUpPowerOfTwo(options().shm.ring_bytes);
    config_.max_message_bytes = options().max_message_bytes;
    config_.op_timeout = options().op_timeout;
    PLEXUS_ASSIGN_OR_RETURN(allow_cma_, kShmCmaParam.Get());
    PLEXUS_RETURN_IF_ERROR(ResolveThreshold(kShmCmaThresholdParam, options().shm.cma_threshold,
                                            &config_.cma_threshold));
    PLEXUS_RETURN_IF_ERROR(ResolveThreshold(kShmExchangeCmaThresholdParam,
                                            options().shm.exchange_cma_threshold,
                                            &config_.exchange_cma_threshold));
    PLEXUS_RETURN_IF_ERROR(ResolveThreshold(
        kShmLoneCmaThresholdParam, options().shm.lone_cma_threshold, &config_.lone_cma_threshold));
    PLEXUS_ASSIGN_OR_RETURN(const HoldLimits held, ResolveHoldLimits(options()));
    config_.held_bytes_per_connection = held.per_connection;
    config_.held_budget = std::make_shared<HoldBudget>(held.per_device);
    if (options().progress == ProgressMode::kThread) {
      thread_ = std::thread([this] { ThreadLoop(); });
      pthread_setname_np(thread_.native_handle(), "plexus-shm");
    }
    return absl::OkStatus();
  }

  Backend backend() const override { return Backend::kShm; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes,
                                                         MemoryKind kind) override {
    return registry_->Register(data, bytes, kind);
  }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(std::string_view address) override;

  absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                      CompletionQueue* cq) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
    PLEXUS_ASSIGN_OR_RETURN(auto session,
                            ConnectSession(std::string(address), doorbell_.fd.get(), Handshake()));
    return Adopt(std::move(session), cq);
  }

  HandshakeOptions Handshake() const {
    HandshakeOptions h;
    h.ring_bytes = ring_bytes_;
    h.timeout = options().connect_timeout;
    h.allow_cma = allow_cma_;
    return h;
  }

  int doorbell_fd() const { return doorbell_.fd.get(); }

  std::unique_ptr<Connection> Adopt(Session session, CompletionQueue* cq) {
    auto state = std::make_shared<ConnectionState>(std::move(session), cq, registry_,
                                                   doorbell_.bell, config_);
    auto conn = std::make_unique<ShmConnection>(shared_from_this(), state);
    state->set_id(conn->id());
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      conns_.push_back(state);
      conns_version_.fetch_add(1, std::memory_order_release);
    }
    doorbell_.bell.Ring();
    return conn;
  }

  void Remove(const std::shared_ptr<ConnectionState>& state) {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (size_t i = 0; i < conns_.size(); ++i) {
      if (conns_[i] == state) {
        conns_[i] = conns_.back();
        conns_.pop_back();
        conns_version_.fetch_add(1, std::memory_order_release);
        break;
      }
    }
  }

 protected:
  void DriveProgress(absl::Duration max_block) override {
    std::unique_lock<std::mutex> lock(progress_mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      // Another caller is moving bytes; do not burn the second core competing with it.
      base::WaitPolicy::AwaitOthersProgress(max_block);
      return;
    }
    if (RunOnce() || max_block <= absl::ZeroDuration()) return;
    const absl::Time start = absl::Now();
    if (base::WaitPolicy::SpinUntil(start + std::min(max_block, kSpinBeforeSleep),
                                    [this] { return RunOnce(); })) {
      return;
    }
    const absl::Duration left = max_block - (absl::Now() - start);
    if (left > absl::ZeroDuration()) SleepOnce(std::min(left, kMaxSleep));
    RunOnce();
  }

 private:
  // One pass over every connection; true when anything moved. Caller holds progress_mu_.
  bool RunOnce() {
    if (const uint64_t v = conns_version_.load(std::memory_order_acquire); v != snapshot_version_) {
      std::lock_guard<std::mutex> lock(conns_mu_);
      snapshot_ = conns_;
      snapshot_version_ = conns_version_.load(std::memory_order_relaxed);
    }
    const absl::Time now = absl::Now();
    bool did = false;
    for (const auto& c : snapshot_) {
      if (!c->done()) did |= c->Pump(now);
    }
    if (now - last_liveness_ >= kLivenessInterval) CheckLiveness(now);
    return did;
  }

  void SleepOnce(absl::Duration max) {
    const uint32_t token = doorbell_.bell.BeginSleep();
    if (!RunOnce() && !stop_.load(std::memory_order_relaxed)) doorbell_.bell.Sleep(token, max);
    doorbell_.bell.EndSleep();
  }

  // Peers that died or closed their socket, and peers that stopped making progress.
  void CheckLiveness(absl::Time now) {
    last_liveness_ = now;
    pollfds_.clear();
    for (const auto& c : snapshot_) {
      if (!c->done()) pollfds_.push_back(pollfd{c->socket_fd(), POLLIN, 0});
    }
    if (!pollfds_.empty() && ::poll(pollfds_.data(), pollfds_.size(), 0) > 0) {
      size_t i = 0;
      for (const auto& c : snapshot_) {
        if (c->done()) continue;
        if (pollfds_[i].revents != 0) c->OnSocketHangup();
        ++i;
      }
    }
    for (const auto& c : snapshot_) {
      if (!c->done()) c->CheckTimeout(now);
    }
  }

  void ThreadLoop() {
    std::lock_guard<std::mutex> lock(progress_mu_);
    absl::Time busy_at = absl::Now();
    // Yield rather than pause: the threads this one serves (the callers waiting for its
    // completions) may need this core, and a 2-core host has no spare one.
    const base::WaitPolicy wait(absl::ZeroDuration(), kSpinBeforeSleep);
    while (!stop_.load(std::memory_order_relaxed)) {
      if (RunOnce()) {
        busy_at = absl::Now();
        continue;
      }
      // Yield while recently busy, even on a contended CPU: sleeping on the doorbell there as
      // soon as a yield came back late (as the collectives' waiters do) cost much of the shm
      // RPC rate (docs/measurements/torch.md, "Performance runs"), since every message then
      // needs a wake-up of this thread.
      if (wait.At(absl::Now() - busy_at) == base::WaitPolicy::Phase::kYield) {
        base::WaitPolicy::Yield(/*can_sleep=*/false);
        continue;
      }
      SleepOnce(kMaxSleep);
      busy_at = absl::InfinitePast();
    }
  }

  std::shared_ptr<RegionRegistry> registry_;
  LocalDoorbell doorbell_;
  size_t ring_bytes_ = 0;
  bool allow_cma_ = true;
  EngineConfig config_;

  std::mutex conns_mu_;
  std::vector<std::shared_ptr<ConnectionState>> conns_;
  std::atomic<uint64_t> conns_version_{0};

  // Owned by whoever holds progress_mu_.
  std::mutex progress_mu_;
  std::vector<std::shared_ptr<ConnectionState>> snapshot_;
  uint64_t snapshot_version_ = ~uint64_t{0};
  std::vector<pollfd> pollfds_;
  absl::Time last_liveness_ = absl::InfinitePast();

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

ShmConnection::ShmConnection(std::shared_ptr<ShmDevice> device,
                             std::shared_ptr<ConnectionState> state)
    : device_(std::move(device)), state_(std::move(state)) {}

void ShmConnection::Close() {
  std::call_once(closed_, [this] {
    state_->Close();
    device_->Remove(state_);
  });
}

// Accepts shm connections. Connectors are served concurrently: each accepted socket must finish
// the handshake (hello, then final message) within connect_timeout, and one that is silent,
// sends garbage or fails the handshake is dropped without delaying the others or failing the
// Accept; at most kMaxHandshakes wait at once (the oldest is dropped first).
class ShmListener final : public Listener {
 public:
  ShmListener(std::shared_ptr<ShmDevice> device, UniqueFd fd, std::string address)
      : device_(std::move(device)), fd_(std::move(fd)), address_(std::move(address)) {}

  std::string address() const override { return address_; }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(CompletionQueue* cq,
                                                     absl::Duration timeout) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Accept: null completion queue");
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    last_error_ = absl::OkStatus();
    for (;;) {
      const absl::Time now = absl::Now();
      for (Pending& p : pending_) {
        if (p.deadline <= now) {
          Drop(p, absl::DeadlineExceededError(
                      absl::StrCat("did not finish the handshake within the connect timeout (",
                                   absl::FormatDuration(device_->options().connect_timeout), ")")));
        }
      }
      std::erase_if(pending_, [](const Pending& p) { return !p.alive(); });
      if (ready_.has_value()) {
        Session session = std::move(*ready_);
        ready_.reset();
        return device_->Adopt(std::move(session), cq);
      }
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shm: no connection to '", address_, "' within ", absl::FormatDuration(timeout),
            last_error_.ok() ? ""
                             : absl::StrCat(" (last rejected: ", last_error_.ToString(), ")")));
      }
      absl::Time wake = deadline;
      std::vector<pollfd> pfds;
      pfds.reserve(pending_.size() + 1);
      pfds.push_back({fd_.get(), POLLIN, 0});
      for (const Pending& p : pending_) {
        pfds.push_back({p.fd(), POLLIN, 0});
        wake = std::min(wake, p.deadline);
      }
      const absl::Duration wait =
          std::clamp(wake - now, absl::Milliseconds(1), absl::Milliseconds(1000));
      const int rc =
          ::poll(pfds.data(), pfds.size(), static_cast<int>(absl::ToInt64Milliseconds(wait)));
      if (rc < 0 && errno != EINTR) {
        return absl::InternalError(
            absl::StrCat("shm: accept on '", address_, "': poll: ", std::string(strerror(errno))));
      }
      if (rc <= 0) continue;
      // Sockets of this round are pending_[0 .. pfds.size() - 1); at most one finishes per call.
      for (size_t i = 1; i < pfds.size() && !ready_.has_value(); ++i) {
        if (pfds[i].revents != 0) Advance(pending_[i - 1]);
      }
      std::erase_if(pending_, [](const Pending& p) { return !p.alive(); });
      if (pfds[0].revents != 0) {
        PLEXUS_RETURN_IF_ERROR(AcceptPending());
      }
    }
  }

 private:
  static constexpr size_t kMaxHandshakes = 256;
  static constexpr int kAcceptBurst = 64;

  // A connector in the middle of its handshake: `socket` until its hello came, then `session`
  // (which owns the socket from then on).
  struct Pending {
    UniqueFd socket;
    std::optional<Session> session;
    absl::Time deadline;
    int fd() const { return session.has_value() ? session->socket.get() : socket.get(); }
    bool alive() const { return session.has_value() || socket.valid(); }
  };

  void Drop(Pending& p, const absl::Status& why) {
    last_error_ = why;
    p.session.reset();
    p.socket = UniqueFd();
  }

  // Moves one readable connector a step through the handshake.
  void Advance(Pending& p) {
    if (!p.session.has_value()) {
      absl::StatusOr<Session> s =
          BeginAcceptSession(std::move(p.socket), device_->doorbell_fd(), device_->Handshake());
      if (!s.ok()) return Drop(p, s.status());
      p.session = std::move(*s);
      return;
    }
    if (absl::Status s = FinishAcceptSession(&*p.session, p.deadline); !s.ok()) {
      return Drop(p, s);
    }
    ready_ = std::move(p.session);
    p.session.reset();
  }

  absl::Status AcceptPending() {
    for (int i = 0; i < kAcceptBurst; ++i) {
      const int sock = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (sock < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return absl::InternalError(
            absl::StrCat("shm: accept on '", address_, "': ", std::string(strerror(errno))));
      }
      if (pending_.size() >= kMaxHandshakes) {
        Drop(pending_.front(),
             absl::ResourceExhaustedError(absl::StrCat(
                 "dropped: ", kMaxHandshakes, " connectors in the middle of their handshake")));
        pending_.erase(pending_.begin());
      }
      pending_.push_back(
          Pending{UniqueFd(sock), std::nullopt, absl::Now() + device_->options().connect_timeout});
    }
    return absl::OkStatus();
  }

  std::shared_ptr<ShmDevice> device_;
  UniqueFd fd_;
  std::string address_;
  std::vector<Pending> pending_;  // in arrival order
  std::optional<Session> ready_;  // handshake done, not yet returned by Accept
  absl::Status last_error_;       // why the last connector was dropped
};

absl::StatusOr<std::unique_ptr<Listener>> ShmDevice::Listen(std::string_view address) {
  std::string name = address.empty() ? UniqueAddress() : std::string(address);
  PLEXUS_ASSIGN_OR_RETURN(auto fd, ListenSocket(name));
  return std::make_unique<ShmListener>(shared_from_this(), std::move(fd), std::move(name));
}

}  // namespace

absl::StatusOr<ConnectionStats> GetConnectionStats(const Connection& connection) {
  const auto* shm = dynamic_cast<const ShmConnection*>(&connection);
  if (shm == nullptr) return absl::InvalidArgumentError("not an shm connection");
  return shm->stats();
}

}  // namespace shm

absl::StatusOr<std::shared_ptr<Device>> CreateShmDevice(const DeviceOptions& options) {
  if (options.shm.ring_bytes > shm::kMaxRingBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm.ring_bytes = ", options.shm.ring_bytes,
                                                   " exceeds the limit of ", shm::kMaxRingBytes));
  }
  auto device = std::make_shared<shm::ShmDevice>(options);
  PLEXUS_RETURN_IF_ERROR(device->Init());
  return device;
}

}  // namespace plexus::transport::internal
