// inproc: connections between threads of one process. Operations complete synchronously inside
// the Post call (the bytes are copied under the link's lock), so ordering is the posting order and
// no progress engine is needed.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "backends.hpp"
#include "cuda_copy.hpp"
#include "mailbox.hpp"
#include "make_completion.hpp"
#include "matcher.hpp"
#include "plexus/base/status.hpp"
#include "produce_consume.hpp"
#include "region_registry.hpp"

namespace plexus::transport::internal {
namespace {

absl::Status CopyBytes(uint8_t* dst, MemoryKind dst_kind, const uint8_t* src, MemoryKind src_kind,
                       size_t n) {
  if (n == 0) return absl::OkStatus();
  if (dst_kind == MemoryKind::kHost && src_kind == MemoryKind::kHost) {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  if (src_kind == MemoryKind::kHost) return CopyHostToCuda(dst, src, n);
  if (dst_kind == MemoryKind::kHost) return CopyCudaToHost(dst, src, n);
  std::vector<uint8_t> staging(n);
  PLEXUS_RETURN_IF_ERROR(CopyCudaToHost(staging.data(), src, n));
  return CopyHostToCuda(dst, staging.data(), n);
}

// One endpoint's state. It lives in the Link, so that the connecting side can send (and write)
// before the listening side has accepted: the bytes wait in its matcher, as in a socket's
// backlog.
struct Side {
  bool open = true;
  CompletionQueue* cq = nullptr;  // null until accepted; completions wait in `early`
  uint64_t connection_id = 0;
  std::shared_ptr<RegionRegistry> registry;
  std::unique_ptr<Matcher> matcher;  // messages sent to this side
  std::vector<Completion> early;

  void InitMatcher(std::string peer, const HoldLimits& limits, std::shared_ptr<HoldBudget> budget) {
    MatcherConfig config;
    config.backend = "inproc";
    config.peer = std::move(peer);
    config.connection_cap = limits.per_connection;
    config.device = std::move(budget);
    config.max_spare_bytes = SpareBytesFor(limits.per_connection);
    matcher = std::make_unique<Matcher>(std::move(config),
                                        [this](uint64_t wr_id, absl::Status status, size_t bytes) {
                                          Complete(Opcode::kRecv, wr_id, std::move(status), bytes);
                                        });
  }

  void Complete(Opcode op, uint64_t wr_id, absl::Status status, size_t bytes,
                std::optional<uint32_t> immediate = std::nullopt) {
    Completion c = MakeCompletion(connection_id, op, wr_id, std::move(status), bytes, immediate);
    if (cq != nullptr) {
      cq->Push(std::move(c));
    } else {
      early.push_back(std::move(c));
    }
  }
};

// The shared state of one connection: both endpoints lock it for every operation.
struct Link {
  std::mutex mu;
  Side sides[2];
  absl::Status closed;            // non-OK once either side closed or failed
  int closed_by = -1;             // the side whose Close or failure set `closed`
  std::atomic<bool> down{false};  // closed.ok() is false; read without the lock
  MailboxInbox inboxes[2];        // inboxes[side] is what `side` receives
};

class InprocConnection final : public Connection {
 public:
  InprocConnection(std::shared_ptr<Link> link, int side, std::string peer)
      : link_(std::move(link)),
        side_(side),
        peer_(std::move(peer)),
        mailbox_(&link_->inboxes[1 - side], &link_->inboxes[side], &link_->down, [this] {
          std::lock_guard<std::mutex> lock(link_->mu);
          return link_->closed_by == side_ ? link_->closed : PeerView(link_->closed);
        }) {}
  ~InprocConnection() override { Close(); }

  Side& self() { return link_->sides[side_]; }
  Side& peer() { return link_->sides[1 - side_]; }

  absl::Status PostSend(absl::Span<const ConstBuffer> buffers, uint64_t wr_id) override {
    size_t total = 0;
    for (const ConstBuffer& b : buffers) {
      if (b.data == nullptr && b.size > 0)
        return absl::InvalidArgumentError("PostSend: null buffer");
      total += b.size;
    }
    return Send(total, wr_id, [&](const Matcher::Slot& slot, bool& consumer_failed) {
      if (slot.consumer == nullptr) {
        Gather(buffers, slot.dest);
        return absl::OkStatus();
      }
      consumer_failed = true;  // the consumer takes the sender's bytes in place
      size_t offset = 0;
      for (const ConstBuffer& b : buffers) {
        PLEXUS_RETURN_IF_ERROR(
            ConsumeRange(*slot.consumer, offset,
                         absl::MakeConstSpan(static_cast<const uint8_t*>(b.data), b.size), total));
        offset += b.size;
      }
      return absl::OkStatus();
    });
  }

  absl::Status PostSendProduced(size_t length, Producer producer, uint64_t wr_id) override {
    return Send(length, wr_id, [&](const Matcher::Slot& slot, bool& consumer_failed) {
      if (slot.consumer == nullptr) {
        return ProduceRange(producer, 0, absl::MakeSpan(slot.dest, length), length);
      }
      // Produced into a consumed receive: through one cache-sized chunk.
      std::vector<uint8_t> chunk(std::min(length, kMaxProduceConsumeBytes));
      for (size_t offset = 0; offset < length; offset += chunk.size()) {
        const size_t n = std::min(chunk.size(), length - offset);
        PLEXUS_RETURN_IF_ERROR(
            ProduceRange(producer, offset, absl::MakeSpan(chunk.data(), n), length));
        consumer_failed = true;
        PLEXUS_RETURN_IF_ERROR(
            ConsumeRange(*slot.consumer, offset, absl::MakeConstSpan(chunk.data(), n), length));
        consumer_failed = false;
      }
      return absl::OkStatus();
    });
  }

  absl::Status PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    Matcher& m = *self().matcher;
    if (!link_->closed.ok() && !m.has_unclaimed()) return link_->closed;
    if (absl::Status s = m.PostRecvConsumed(max_length, std::move(consumer), wr_id); !s.ok()) {
      CloseLocked(s);
    }
    return absl::OkStatus();
  }

 private:
  // One message of `total` bytes to the peer; `fill` puts its bytes where the matcher says (a
  // buffer, or a consumer) and sets its flag while a consumer runs. An error from `fill` fails
  // the send, the matched receive, and the connection, on behalf of the side whose callback
  // failed: the message was admitted and cannot be taken back.
  template <typename Fill>
  absl::Status Send(size_t total, uint64_t wr_id, Fill fill) {
    std::lock_guard<std::mutex> lock(link_->mu);
    PLEXUS_RETURN_IF_ERROR(link_->closed);
    Matcher& m = *peer().matcher;
    const bool direct = m.has_posted_recv();
    Matcher::Slot slot;
    absl::StatusOr<Matcher::Admission> admitted = m.Admit(total, &slot);
    if (!admitted.ok()) {
      if (!direct) return admitted.status();  // too large to hold: refused, nothing is lost
      // Too long for the matched receive (which completed with the error).
      self().Complete(Opcode::kSend, wr_id, admitted.status(), 0);
      CloseLocked(admitted.status());
      return absl::OkStatus();
    }
    if (*admitted == Matcher::Admission::kWait) {
      // There is no wire to stop reading from: the sender is told to wait instead.
      return absl::ResourceExhaustedError(absl::StrCat(
          "inproc: the peer holds ", m.held_bytes(),
          " bytes of messages it has not posted receives for; this message of ", total,
          " bytes does not fit under its cap (DeviceOptions::max_held_bytes_per_connection / "
          "_per_device); retry once the peer posted receives"));
    }
    bool consumer_failed = false;
    if (absl::Status filled = fill(slot, consumer_failed); !filled.ok()) {
      const absl::Status why = absl::Status(
          filled.code(),
          consumer_failed
              ? absl::StrCat("inproc receive (wr_id ", slot.wr_id, "): ", filled.message())
              : absl::StrCat("inproc send (wr_id ", wr_id, ") to ", peer_, ": ", filled.message()));
      self().Complete(Opcode::kSend, wr_id, consumer_failed ? PeerView(why) : why, 0);
      // A direct receive left the matcher at Admit: it completes here. A held message that is
      // not whole is dropped by the matcher's Fail.
      if (!slot.held) {
        peer().Complete(Opcode::kRecv, slot.wr_id, consumer_failed ? why : PeerView(why), 0);
      }
      CloseLocked(why, consumer_failed ? 1 - side_ : side_);
      return absl::OkStatus();
    }
    if (absl::Status placed = m.Placed(slot); !placed.ok()) {
      // The peer's consumer failed on a held message: its receive carries the error.
      self().Complete(Opcode::kSend, wr_id, absl::OkStatus(), total);
      CloseLocked(placed, 1 - side_);
      return absl::OkStatus();
    }
    self().Complete(Opcode::kSend, wr_id, absl::OkStatus(), total);
    return absl::OkStatus();
  }

 public:
  absl::Status PostRecv(MutableBuffer buffer, uint64_t wr_id) override {
    if (buffer.data == nullptr && buffer.size > 0) {
      return absl::InvalidArgumentError("PostRecv: null buffer");
    }
    std::lock_guard<std::mutex> lock(link_->mu);
    Matcher& m = *self().matcher;
    // Messages that arrived before the connection closed are delivered first.
    if (!link_->closed.ok() && !m.has_unclaimed()) return link_->closed;
    if (absl::Status s = m.PostRecv(buffer, wr_id); !s.ok()) CloseLocked(s);
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<size_t>> PeekNext(MutableBuffer head) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    return self().matcher->PeekNext(head);
  }

  absl::Status PostWrite(const MemoryRegion& local, size_t local_offset, size_t length,
                         const RegionHandle& remote, size_t remote_offset,
                         std::optional<uint32_t> immediate, uint64_t wr_id) override {
    PLEXUS_RETURN_IF_ERROR(CheckLocalRange(local, local_offset, length));
    if (remote.backend != Backend::kInproc) {
      return absl::InvalidArgumentError(absl::StrCat("PostWrite: remote handle is for backend ",
                                                     std::string(BackendName(remote.backend))));
    }
    std::lock_guard<std::mutex> lock(link_->mu);
    PLEXUS_RETURN_IF_ERROR(link_->closed);
    PLEXUS_ASSIGN_OR_RETURN(WriteTarget target,
                            peer().registry->Resolve(remote.id, remote_offset, length));
    const absl::Status copied =
        CopyBytes(target.data, target.kind,
                  static_cast<const uint8_t*>(local.data()) + local_offset, local.kind(), length);
    self().Complete(Opcode::kWrite, wr_id, copied, copied.ok() ? length : 0);
    if (copied.ok() && immediate.has_value()) {
      peer().Complete(Opcode::kRemoteWrite, 0, absl::OkStatus(), length, immediate);
    }
    return absl::OkStatus();
  }

  void Close() override {
    std::lock_guard<std::mutex> lock(link_->mu);
    if (!self().open) return;
    CloseLocked(absl::CancelledError("connection closed locally"));
    self().open = false;
    self().cq = nullptr;
    self().early.clear();
  }

  absl::Status status() const override {
    std::lock_guard<std::mutex> lock(link_->mu);
    return link_->closed;
  }
  std::string peer_address() const override { return peer_; }
  Mailbox* mailbox() override { return &mailbox_; }

 private:
  // How the other side sees `why`, an end of the connection caused here.
  static absl::Status PeerView(const absl::Status& why) {
    if (why.ok()) return why;
    return absl::Status(
        absl::IsCancelled(why) ? absl::StatusCode::kAborted : absl::StatusCode::kUnavailable,
        absl::StrCat("peer closed the connection: ", std::string(why.message())));
  }

  static void Gather(absl::Span<const ConstBuffer> buffers, uint8_t* out) {
    for (const ConstBuffer& b : buffers) {
      if (b.size > 0) std::memcpy(out, b.data, b.size);
      out += b.size;
    }
  }

  // Fails every outstanding receive on both ends; the other end than `by` (this side, unless
  // a consumer of the peer's failed) learns why.
  void CloseLocked(const absl::Status& why, int by = -1) {
    if (by < 0) by = side_;
    if (link_->closed.ok()) {
      link_->closed = why;
      link_->closed_by = by;
    }
    link_->down.store(true, std::memory_order_release);
    for (int i = 0; i < 2; ++i) {
      Side& end = link_->sides[i];
      if (!end.open || end.matcher == nullptr) continue;  // null: never reached a listener
      // The other end may still receive what was sent to it; `by`'s held messages go.
      end.matcher->Fail(i == by ? why : PeerView(why), /*keep_whole=*/i != by);
    }
  }

  std::shared_ptr<Link> link_;
  const int side_;
  std::string peer_;
  MailboxEndpoint mailbox_;
};

struct Directory {
  std::mutex mu;
  std::condition_variable cv;
  struct Entry {
    std::shared_ptr<RegionRegistry> registry;
    HoldLimits limits;
    std::shared_ptr<HoldBudget> budget;
    std::deque<std::shared_ptr<Link>> pending;
  };
  // Node-based: Accept keeps a reference to its entry's queue while it waits on `cv` without the
  // lock, and other threads' Listen calls insert meanwhile (a flat map would move the entry).
  absl::node_hash_map<std::string, Entry> listeners;
  uint64_t next_name = 0;
};

Directory& GlobalDirectory() {
  static Directory* d = new Directory();
  return *d;
}

class InprocListener final : public Listener {
 public:
  explicit InprocListener(std::string name) : name_(std::move(name)) {}
  ~InprocListener() override {
    Directory& d = GlobalDirectory();
    std::lock_guard<std::mutex> lock(d.mu);
    d.listeners.erase(name_);
  }
  std::string address() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(CompletionQueue* cq,
                                                     absl::Duration timeout) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Accept: null completion queue");
    Directory& d = GlobalDirectory();
    std::unique_lock<std::mutex> lock(d.mu);
    auto& pending = d.listeners[name_].pending;
    const auto ready = [&] { return !pending.empty(); };
    if (timeout == absl::InfiniteDuration()) {
      d.cv.wait(lock, ready);
    } else if (!d.cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), ready)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "inproc accept on '", name_, "': no connection within ", absl::FormatDuration(timeout)));
    }
    std::shared_ptr<Link> link = std::move(pending.front());
    pending.pop_front();
    lock.unlock();
    auto conn = std::make_unique<InprocConnection>(link, 1, "inproc-client");
    std::lock_guard<std::mutex> link_lock(link->mu);
    Side& side = link->sides[1];
    side.cq = cq;
    side.connection_id = conn->id();
    for (Completion& c : side.early) {
      c.connection_id = conn->id();
      cq->Push(std::move(c));
    }
    side.early.clear();
    return conn;
  }

 private:
  std::string name_;
};

class InprocDevice final : public Device {
 public:
  InprocDevice(const DeviceOptions& options, HoldLimits limits)
      : Device(options),
        registry_(std::make_shared<RegionRegistry>(Backend::kInproc)),
        limits_(limits),
        budget_(std::make_shared<HoldBudget>(limits.per_device)) {}

  Backend backend() const override { return Backend::kInproc; }

  // Everything completes inside the Post calls: there is nothing for a caller to drive.
  std::unique_ptr<CompletionQueue> CreateCompletionQueue() override {
    return std::make_unique<CompletionQueue>(nullptr);
  }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes,
                                                         MemoryKind kind) override {
    return registry_->Register(data, bytes, kind);
  }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(std::string_view address) override {
    Directory& d = GlobalDirectory();
    std::lock_guard<std::mutex> lock(d.mu);
    std::string name =
        address.empty() ? absl::StrCat("inproc-", d.next_name++) : std::string(address);
    if (d.listeners.contains(name)) {
      return absl::AlreadyExistsError(absl::StrCat("inproc address '", name, "' is in use"));
    }
    Directory::Entry& entry = d.listeners[name];
    entry.registry = registry_;
    entry.limits = limits_;
    entry.budget = budget_;
    return std::make_unique<InprocListener>(name);
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                      CompletionQueue* cq) override {
    if (cq == nullptr) return absl::InvalidArgumentError("Connect: null completion queue");
    Directory& d = GlobalDirectory();
    auto link = std::make_shared<Link>();
    auto conn = std::make_unique<InprocConnection>(link, 0, std::string(address));
    link->sides[0].cq = cq;
    link->sides[0].connection_id = conn->id();
    link->sides[0].registry = registry_;
    link->sides[0].InitMatcher(std::string(address), limits_, budget_);
    {
      std::lock_guard<std::mutex> lock(d.mu);
      auto it = d.listeners.find(std::string(address));
      if (it == d.listeners.end()) {
        return absl::UnavailableError(absl::StrCat("inproc connect to '", std::string(address),
                                                   "': no listener at that address"));
      }
      link->sides[1].registry = it->second.registry;
      link->sides[1].InitMatcher("inproc-client", it->second.limits, it->second.budget);
      it->second.pending.push_back(link);
    }
    d.cv.notify_all();
    return conn;
  }

 protected:
  void DriveProgress(absl::Duration) override {}

 private:
  std::shared_ptr<RegionRegistry> registry_;
  const HoldLimits limits_;
  std::shared_ptr<HoldBudget> budget_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Device>> CreateInprocDevice(const DeviceOptions& options) {
  PLEXUS_ASSIGN_OR_RETURN(const HoldLimits limits, ResolveHoldLimits(options));
  return std::make_shared<InprocDevice>(options, limits);
}

}  // namespace plexus::transport::internal
