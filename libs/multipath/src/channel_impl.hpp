// MultipathChannel's implementation class, shared by channel.cpp (the public calls, the progress
// thread, Create), channel_datapath.cpp (chunking, scheduling, posting, acknowledgements,
// reassembly) and channel_failure.cpp (path failure, fences, timers). Everything runs under one
// mutex, either in the caller's thread (posting new operations) or in the channel's progress
// thread (completions of the path connections, timers).
#pragma once

#include "plexus/multipath/channel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/multipath/monitor.hpp"
#include "plexus/netmodel/rate_controller.hpp"
#include "reassembler.hpp"
#include "wire.hpp"

namespace plexus::multipath {

namespace pt = ::plexus::transport;
using internal::Frame;
using internal::FrameType;
using internal::kHeaderSize;

namespace internal {

inline constexpr uint64_t kControlBit = uint64_t{1} << 63;
inline constexpr uint64_t kRecvBit = uint64_t{1} << 62;
inline constexpr int kRecvSlots = 16;
// The largest max_chunks_in_flight accepted (a path whose bandwidth-delay product is more than
// 8 chunks needs more to stay full).
inline constexpr int kMaxInFlightCap = 64;

inline std::atomic<uint64_t> next_channel_id{1};

// Settings only the library's own adapters use (MultipathDevice).
struct ChannelInternalOptions {
  // The connection_id of every user completion; 0 = the channel's own id().
  uint64_t completion_id = 0;
  // Fail the channel (Aborted when a peer closed a path, else Unavailable) as soon as every
  // path added so far is dead, instead of waiting for AddPath: for owners that never add paths
  // after set-up, where all paths gone means the peer is gone.
  bool fail_when_all_paths_dead = false;
};

// Create with internal options (MultipathChannel::Create is this with the defaults).
class ChannelFactory {
 public:
  static absl::StatusOr<std::unique_ptr<MultipathChannel>> Create(
      const ChannelOptions& options, transport::CompletionQueue* user_cq,
      const ChannelInternalOptions& internal_options);
};

}  // namespace internal

using internal::kControlBit;
using internal::kMaxInFlightCap;
using internal::kRecvBit;
using internal::kRecvSlots;

class MultipathChannel::Impl {
 public:
  Impl(const ChannelOptions& options, absl::Duration path_timeout, pt::CompletionQueue* user_cq,
       const internal::ChannelInternalOptions& internal_options,
       std::unique_ptr<Scheduler> scheduler)
      : options_(options),
        path_timeout_(path_timeout),
        user_cq_(user_cq),
        id_(internal::next_channel_id.fetch_add(1) | (uint64_t{1} << 48)),
        completion_id_(internal_options.completion_id != 0 ? internal_options.completion_id : id_),
        fail_when_all_paths_dead_(internal_options.fail_when_all_paths_dead),
        scheduler_(std::move(scheduler)),
        reassembler_(options.max_held_bytes) {
    chunk_bytes_ = options.chunk_bytes;
    cap_ = options.max_chunks_in_flight;
    silence_timeout_ = options.silence_timeout;
    thread_ = std::thread([this] { Run(); });
    if (options_.redial) revive_thread_ = std::thread([this] { ReviveLoop(); });
  }

  ~Impl();

  // ---- Public API (called with no lock held) ----

  absl::StatusOr<int> AddPath(std::unique_ptr<pt::Connection> conn) {
    std::lock_guard<std::mutex> lock(mu_);
    return AddPathLocked(std::move(conn), -1);
  }

  absl::Status Send(absl::Span<const pt::ConstBuffer> buffers, uint64_t wr_id);

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    Fail(absl::CancelledError("multipath connection closed locally"));
    FlushReceiver();
    FlushUser();
  }

  absl::Status Recv(pt::MutableBuffer buffer, uint64_t wr_id);

  absl::Status Write(const pt::MemoryRegion& local, size_t local_offset, size_t length,
                     const pt::RegionHandle& remote, size_t remote_offset,
                     std::optional<uint32_t> immediate, uint64_t wr_id) {
    if (local_offset > local.size() || length > local.size() - local_offset) {
      return absl::OutOfRangeError(absl::StrCat("Write: local bytes [", local_offset, ", +", length,
                                                ") outside the region of ", local.size()));
    }
    if (remote_offset > remote.length || length > remote.length - remote_offset) {
      return absl::OutOfRangeError(absl::StrCat("Write: remote bytes [", remote_offset, ", +",
                                                length, ") outside the peer's region of ",
                                                remote.length));
    }
    std::lock_guard<std::mutex> lock(mu_);
    PLEXUS_RETURN_IF_ERROR(failed_);
    auto op = std::make_unique<Op>();
    op->kind = OpKind::kWrite;
    op->wr_id = wr_id;
    op->local = &local;
    op->local_offset = local_offset;
    op->remote = remote;
    op->remote_offset = remote_offset;
    op->total = length;
    op->immediate = immediate;
    Enqueue(std::move(op));
    return absl::OkStatus();
  }

  absl::Status SetChunkBytes(size_t bytes);

  absl::Status SetMaxChunksInFlight(int chunks);

  absl::Status SetScheduler(std::string_view name) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (scheduler_->name() == name) return absl::OkStatus();
    }
    PLEXUS_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> next, MakeScheduler(name));
    return SetScheduler(std::move(next));
  }

  absl::Status SetScheduler(std::unique_ptr<Scheduler> scheduler) {
    if (scheduler == nullptr) return absl::InvalidArgumentError("SetScheduler: null scheduler");
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_ = std::move(scheduler);
    return absl::OkStatus();
  }

  std::string scheduler() const {
    std::lock_guard<std::mutex> lock(mu_);
    return scheduler_->name();
  }

  ChannelStats Stats() const;

  int live_paths() const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& p : paths_) n += p->state == PathState::kUp ? 1 : 0;
    return n;
  }

  absl::Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

  uint64_t id() const { return id_; }
  pt::CompletionQueue* path_queue() { return &path_cq_; }

  void FailPath(int index, absl::Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index < 0 || index >= static_cast<int>(paths_.size())) return;
    PathFailed(*paths_[index], std::move(why));
    Schedule();
    FlushUser();
  }

  void StallPath(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= 0 && index < static_cast<int>(paths_.size())) paths_[index]->stalled = true;
  }

  void PinRtt(int index, absl::Duration rtt) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= 0 && index < static_cast<int>(paths_.size())) paths_[index]->pinned_rtt = rtt;
  }

 private:
  enum class OpKind : uint8_t { kSend, kWrite };
  enum class PathState : uint8_t { kGreeting, kUp, kDead };

  // One user operation.
  struct Op {
    OpKind kind = OpKind::kSend;
    uint64_t wr_id = 0;
    uint64_t seq = 0;
    uint64_t send_index = 0;
    std::vector<pt::ConstBuffer> parts;       // Send: the gathered buffers, empty ones left out
    std::vector<uint64_t> part_end;           // Send: offset just past each part in the message
    const pt::MemoryRegion* local = nullptr;  // Write
    size_t local_offset = 0;
    pt::RegionHandle remote;
    size_t remote_offset = 0;
    std::optional<uint32_t> immediate;
    uint64_t total = 0;
    uint64_t cut = 0;          // bytes cut into chunks so far
    uint32_t chunks = 0;       // chunks cut so far
    uint32_t outstanding = 0;  // chunks not yet acknowledged
    bool mice = false;
    bool notify_queued = false;
    bool done = false;
  };

  // A chunk or notification in flight: the descriptor of Maestro's Table 1. Its slot index and
  // generation travel in the transport wr_id (and the slot in the frame, echoed by the ack), so
  // a completion finds it in O(1); a stale completion (the descriptor moved on) has an old gen.
  struct Desc {
    uint32_t gen = 0;
    bool used = false;
    bool notify = false;
    Op* op = nullptr;
    int path = -1;
    uint32_t chunk = 0;
    uint64_t offset = 0;
    uint32_t length = 0;
    absl::Time posted;
    std::array<uint8_t, kHeaderSize> header{};
  };

  struct Path {
    int index = 0;
    int lane = 0;
    std::unique_ptr<pt::Connection> conn;
    uint64_t conn_id = 0;
    std::string peer;
    PathState state = PathState::kGreeting;
    bool greeted = false;  // the peer's hello arrived (the path was up at some point)
    absl::Status error;
    uint64_t peer_index = 0;
    uint64_t peer_max_chunk = 0;
    std::vector<std::vector<uint8_t>> recv_buffers;
    std::vector<uint32_t> in_flight;  // descriptor slots
    int in_flight_chunks = 0;         // of those, data chunks (the cap counts these)
    uint64_t in_flight_bytes = 0;
    absl::Time last_progress;  // baseline of the silence timeout
    absl::Time last_heard;     // when something last arrived from the peer on this path
    PathMonitor monitor;
    ::plexus::netmodel::TwoSignalRateController rate;
    absl::Time last_signal;
    absl::Time last_tick;
    double load_snapshot = 0;
    uint64_t probe_id = 0;
    bool probe_outstanding = false;
    absl::Time probe_sent;
    absl::Time last_probe;
    bool stalled = false;
    absl::Duration pinned_rtt = absl::ZeroDuration();
    uint64_t bytes_acked = 0, chunks_acked = 0, chunks_reposted = 0, congestion_signals = 0;
  };

  // Revival state of one lane (a network path; see ChannelOptions::redial): redials wait
  // reconnect_backoff, doubling up to max_reconnect_backoff, until one succeeds.
  struct Lane {
    absl::Time next_try = absl::InfinitePast();
    base::Backoff backoff;
  };

  // ---- Helpers (mu_ held) ----

  // Adds a connected path on `lane` (-1: a new lane).
  absl::StatusOr<int> AddPathLocked(std::unique_ptr<pt::Connection> conn, int lane);

  // Whether `lane` has a path that is up or still greeting.
  bool LaneAlive(int lane) const {
    for (const auto& p : paths_) {
      if (p->lane == lane && p->state != PathState::kDead) return true;
    }
    return false;
  }

  // Dead paths give back their connection and receive buffers (after the completion batch that
  // may still read a buffer), so a flapping path costs a few hundred bytes per revival.
  void ReapDeadPaths() {
    for (auto& p : paths_) {
      if (p->state != PathState::kDead || p->recv_buffers.empty()) continue;
      p->conn.reset();
      p->recv_buffers.clear();
      p->recv_buffers.shrink_to_fit();
    }
  }

  // The revival thread (options_.redial set): re-dials dead lanes with bounded back-off.
  void ReviveLoop();

  int Cap(const Path& p) const {
    return std::max(1, static_cast<int>(cap_ * p.rate.factor() + 1e-9));
  }
  absl::Duration Rtt(const Path& p) const {
    return p.pinned_rtt > absl::ZeroDuration() ? p.pinned_rtt : p.monitor.srtt();
  }

  void Enqueue(std::unique_ptr<Op> op);

  int LivePaths() const {
    int n = 0;
    for (const auto& p : paths_) n += p->state == PathState::kUp ? 1 : 0;
    return n;
  }

  void QueueNotify(Op& op) {
    if (op.notify_queued) return;
    op.notify_queued = true;
    notify_.push_back(&op);
  }

  uint32_t AllocDesc();
  void FreeDesc(uint32_t slot) {
    Desc& d = descs_[slot];
    d.used = false;
    ++d.gen;
    d.op = nullptr;
    free_descs_.push_back(slot);
  }
  static uint64_t WrId(uint32_t slot, uint32_t gen) { return (uint64_t{gen} << 32) | slot; }

  std::vector<PathView> Views() const;
  // The scheduler's path for the next chunk among `views`; a choice that is not a view with a
  // free slot (an application's scheduler may err) falls back to MinRttPath's.
  int PickPath(absl::Span<const PathView> views);

  // Payload bytes of the next chunk of a Send (bounded by the peer's receive buffers).
  uint64_t SendChunkLimit() const;

  // Posts work on free path slots: reposts first, then notifications, then new chunks.
  void Schedule();

  void PostDesc(uint32_t slot, Path& p);

  absl::Status PostRecvBuffer(Path& p, int slot) {
    auto& buf = p.recv_buffers[slot];
    const uint64_t wr_id = kRecvBit | (uint64_t(p.index) << 16) | uint64_t(slot);
    return p.conn->PostRecv(pt::MutableBuffer{buf.data(), buf.size()}, wr_id);
  }

  void SendControl(Path& p, const Frame& f);

  // Appends to `out` the slices of a Send's parts covering message bytes [offset, +length).
  static void SliceParts(const Op& op, uint64_t offset, uint64_t length,
                         std::vector<pt::ConstBuffer>& out);

  // With fail_when_all_paths_dead_: fails the channel once every path is dead.
  void MaybeFailAllDead(const absl::Status& last);

  // A live path for control traffic (lowest RTT), or null.
  Path* ControlPath() {
    std::vector<PathView> views = Views();
    for (PathView& v : views) v.has_slot = true;
    const int p = MinRttPath(views);
    return p < 0 ? nullptr : paths_[p].get();
  }

  // The path is gone: close it, move its chunks to the repost queue (each exactly once: the
  // descriptor moves, and completions of the old post are stale by generation), and fence the
  // peer, which must close its end before any operation that used the path completes, so that
  // bytes still in the dead path's pipe can never land after the operation's completion.
  void PathFailed(Path& p, absl::Status why);

  void SendPathDowns();

  void Complete(Op& op, absl::Status status);

  // A chunk or notification was acknowledged (Send) or completed (Write chunk).
  void DescDone(uint32_t slot, absl::Time now);

  void OnFrame(Path& p, const Frame& f, absl::Span<const uint8_t> payload);

  // ChannelOptions::ack_ahead: a copy of a chunk's ack on the lowest-RTT path, when that is
  // not the path the chunk arrived on.
  void SendAckAhead(Path& arrived, Frame ack);

  void MaybeSignalOverload(Path& p);

  // The channel cannot go on (a broken peer, or held bytes over the cap).
  void Fail(absl::Status why);

  void HandleCompletion(const pt::Completion& c);

  void Timers(absl::Time now);

  void FlushReceiver() {
    for (pt::Completion& c : reassembler_.TakeCompletions()) {
      c.connection_id = completion_id_;
      user_ready_.push_back(std::move(c));
    }
  }

  void FlushUser() {
    for (pt::Completion& c : user_ready_) user_cq_->Push(std::move(c));
    user_ready_.clear();
  }

  void Run();

  const ChannelOptions options_;
  const absl::Duration path_timeout_;
  absl::Duration silence_timeout_;
  pt::CompletionQueue* const user_cq_;
  const uint64_t id_;
  const uint64_t completion_id_;
  const bool fail_when_all_paths_dead_;
  pt::CompletionQueue path_cq_;  // before paths_: destroyed after the connections

  mutable std::mutex mu_;
  bool stop_ = false;
  absl::Status failed_;
  size_t chunk_bytes_ = 0;
  int cap_ = 8;
  std::unique_ptr<Scheduler> scheduler_;
  internal::Reassembler reassembler_;
  std::vector<std::unique_ptr<Path>> paths_;
  absl::flat_hash_map<uint64_t, int> by_connection_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Op>> ops_;
  std::deque<Op*> to_cut_;
  std::deque<Op*> notify_;
  std::deque<uint32_t> repost_;
  std::deque<Desc> descs_;  // stable addresses
  std::vector<uint32_t> free_descs_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<std::array<uint8_t, kHeaderSize>>> control_;
  absl::flat_hash_map<int, bool> fences_;  // dead paths whose peer end is not closed yet
  std::deque<int> pending_path_down_;
  std::optional<absl::Time> have_no_path_since_;
  uint64_t next_seq_ = 0;
  uint64_t next_send_index_ = 0;
  uint64_t next_control_ = 0;
  bool scheduling_ = false;
  absl::Time last_overload_ = absl::InfinitePast();
  absl::Time last_overload_sent_ = absl::InfinitePast();
  uint64_t overload_signals_ = 0;
  std::vector<pt::Completion> user_ready_;
  std::vector<Lane> lanes_;
  std::condition_variable revive_cv_;  // a path died, or the channel is stopping
  uint64_t paths_revived_ = 0;
  uint64_t acks_sent_ahead_ = 0;
  std::string last_redial_error_;
  std::thread thread_;
  std::thread revive_thread_;
};

}  // namespace plexus::multipath
