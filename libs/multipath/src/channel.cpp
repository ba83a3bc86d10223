// MultipathChannel: chunking, scheduling, acknowledgement, failover. Everything runs under one
// mutex, either in the caller's thread (posting new operations) or in the channel's progress
// thread (completions of the path connections, timers).
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
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"
#include "plexus/multipath/monitor.hpp"
#include "reassembler.hpp"
#include "wire.hpp"

namespace plexus::multipath {

namespace pt = ::plexus::transport;
using internal::Frame;
using internal::FrameType;
using internal::kHeaderSize;

namespace {

const base::Param<absl::Duration> kPathTimeoutParam(
    "PLEXUS_MULTIPATH_PATH_TIMEOUT", absl::Milliseconds(100),
    "a multipath path with work outstanding and no completion for this long is declared dead");

constexpr uint64_t kControlBit = uint64_t{1} << 63;
constexpr uint64_t kRecvBit = uint64_t{1} << 62;
constexpr int kRecvSlots = 16;
constexpr int kMaxInFlightCap = 8;

std::atomic<uint64_t> next_channel_id{1};

}  // namespace

class MultipathChannel::Impl {
 public:
  Impl(const ChannelOptions& options, absl::Duration path_timeout, pt::CompletionQueue* user_cq)
      : options_(options),
        path_timeout_(path_timeout),
        user_cq_(user_cq),
        id_(next_channel_id.fetch_add(1) | (uint64_t{1} << 48)),
        scheduler_(MakeScheduler(options.scheduler)),
        reassembler_(options.max_held_bytes) {
    chunk_bytes_ = options.chunk_bytes;
    cap_ = options.max_chunks_in_flight;
    thread_ = std::thread([this] { Run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    path_cq_.Push(pt::Completion{});  // wake the thread
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& path : paths_) {
      if (path->conn) path->conn->Close();
    }
    for (auto& [seq, op] : ops_) {
      Complete(*op, absl::CancelledError("multipath channel destroyed"));
    }
    reassembler_.CancelRecvs(absl::CancelledError("multipath channel destroyed"));
    FlushReceiver();
    FlushUser();
    // Connections go before path_cq_ (declared first), so nothing pushes into a dead queue.
    for (auto& path : paths_) path->conn.reset();
  }

  // ---- Public API (called with no lock held) ----

  absl::StatusOr<int> AddPath(std::unique_ptr<pt::Connection> conn) {
    if (conn == nullptr) return absl::InvalidArgumentError("AddPath: null connection");
    if (!conn->status().ok()) {
      return base::Annotate(conn->status(), "AddPath: the connection is already down");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (paths_.size() >= 0xffff) return absl::ResourceExhaustedError("AddPath: too many paths");
    auto path = std::make_unique<Path>();
    path->index = static_cast<int>(paths_.size());
    path->peer = conn->peer_address();
    path->conn_id = conn->id();
    path->conn = std::move(conn);
    path->last_progress = absl::Now();
    Path& p = *path;
    paths_.push_back(std::move(path));
    by_connection_[p.conn_id] = p.index;
    const size_t buffer_bytes = kHeaderSize + options_.max_chunk_bytes;
    p.recv_buffers.resize(kRecvSlots);
    for (int s = 0; s < kRecvSlots; ++s) {
      p.recv_buffers[s].resize(buffer_bytes);
      if (absl::Status st = PostRecvBuffer(p, s); !st.ok()) {
        PathFailed(p, st);
        return base::Annotate(st, "AddPath: posting receive buffers");
      }
    }
    Frame hello;
    hello.type = FrameType::kHello;
    hello.seq = static_cast<uint64_t>(p.index);
    hello.total = options_.max_chunk_bytes;
    SendControl(p, hello);
    if (p.state == PathState::kDead) return p.error;
    return p.index;
  }

  absl::Status Send(pt::ConstBuffer buffer, uint64_t wr_id) {
    if (buffer.size > 0 && buffer.data == nullptr) {
      return absl::InvalidArgumentError("Send: null buffer");
    }
    std::lock_guard<std::mutex> lock(mu_);
    PLEXUS_RETURN_IF_ERROR(failed_);
    auto op = std::make_unique<Op>();
    op->kind = OpKind::kSend;
    op->wr_id = wr_id;
    op->data = static_cast<const uint8_t*>(buffer.data);
    op->total = buffer.size;
    op->send_index = next_send_index_++;
    Enqueue(std::move(op));
    return absl::OkStatus();
  }

  absl::Status Recv(pt::MutableBuffer buffer, uint64_t wr_id) {
    if (buffer.size > 0 && buffer.data == nullptr) {
      return absl::InvalidArgumentError("Recv: null buffer");
    }
    std::lock_guard<std::mutex> lock(mu_);
    PLEXUS_RETURN_IF_ERROR(failed_);
    reassembler_.PostRecv(buffer, wr_id);
    FlushReceiver();
    FlushUser();
    return absl::OkStatus();
  }

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

  absl::Status SetChunkBytes(size_t bytes) {
    if (bytes == 0 || bytes > options_.max_chunk_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk bytes must be in [1, ", options_.max_chunk_bytes, "], got ", bytes));
    }
    std::lock_guard<std::mutex> lock(mu_);
    chunk_bytes_ = bytes;
    return absl::OkStatus();
  }

  absl::Status SetMaxChunksInFlight(int chunks) {
    if (chunks < 1 || chunks > kMaxInFlightCap) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks in flight per path must be in [1, 8], got ", chunks));
    }
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = chunks;
    Schedule();
    return absl::OkStatus();
  }

  void SetScheduler(SchedulerKind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    if (scheduler_->kind() != kind) scheduler_ = MakeScheduler(kind);
  }

  SchedulerKind scheduler() const {
    std::lock_guard<std::mutex> lock(mu_);
    return scheduler_->kind();
  }

  ChannelStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    ChannelStats out;
    out.duplicates_dropped = reassembler_.duplicates();
    out.overload_signals = overload_signals_;
    for (const auto& path : paths_) {
      const Path& p = *path;
      PathStats s;
      s.index = p.index;
      s.up = p.state == PathState::kUp;
      s.peer = p.peer;
      s.bytes_acked = p.bytes_acked;
      s.chunks_acked = p.chunks_acked;
      s.chunks_reposted = p.chunks_reposted;
      s.in_flight = p.in_flight_chunks;
      s.cap = Cap(p);
      s.bandwidth = p.monitor.bandwidth();
      s.srtt = Rtt(p);
      s.rate_factor = p.rate.factor();
      s.congestion_signals = p.congestion_signals;
      s.error = p.error.ok() ? "" : p.error.ToString();
      out.paths.push_back(std::move(s));
    }
    return out;
  }

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
    const uint8_t* data = nullptr;            // Send
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
    std::unique_ptr<pt::Connection> conn;
    uint64_t conn_id = 0;
    std::string peer;
    PathState state = PathState::kGreeting;
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
    RateController rate;
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

  // ---- Helpers (mu_ held) ----

  int Cap(const Path& p) const {
    return std::max(1, static_cast<int>(cap_ * p.rate.factor() + 1e-9));
  }
  absl::Duration Rtt(const Path& p) const {
    return p.pinned_rtt > absl::ZeroDuration() ? p.pinned_rtt : p.monitor.srtt();
  }

  void Enqueue(std::unique_ptr<Op> op) {
    op->seq = next_seq_++;
    op->mice = op->total < options_.mice_bytes;
    Op* raw = op.get();
    ops_[raw->seq] = std::move(op);
    if (raw->total == 0) {
      QueueNotify(*raw);
    } else {
      to_cut_.push_back(raw);
    }
    if (!have_no_path_since_ && LivePaths() == 0) have_no_path_since_ = absl::Now();
    Schedule();
    FlushUser();
  }

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

  uint32_t AllocDesc() {
    if (free_descs_.empty()) {
      descs_.emplace_back();
      return static_cast<uint32_t>(descs_.size() - 1);
    }
    const uint32_t slot = free_descs_.back();
    free_descs_.pop_back();
    return slot;
  }
  void FreeDesc(uint32_t slot) {
    Desc& d = descs_[slot];
    d.used = false;
    ++d.gen;
    d.op = nullptr;
    free_descs_.push_back(slot);
  }
  static uint64_t WrId(uint32_t slot, uint32_t gen) { return (uint64_t{gen} << 32) | slot; }

  std::vector<PathView> Views() const {
    std::vector<PathView> views;
    views.reserve(paths_.size());
    for (const auto& path : paths_) {
      const Path& p = *path;
      if (p.state != PathState::kUp) continue;
      PathView v;
      v.index = p.index;
      v.has_slot = p.in_flight_chunks < Cap(p);
      v.bandwidth = p.monitor.bandwidth();
      v.rate_factor = p.rate.factor();
      v.srtt = Rtt(p);
      v.min_rtt = p.monitor.min_rtt();
      v.load = p.load_snapshot;
      views.push_back(v);
    }
    return views;
  }

  // Payload bytes of the next chunk of a Send (bounded by the peer's receive buffers).
  uint64_t SendChunkLimit() const {
    uint64_t limit = chunk_bytes_;
    for (const auto& p : paths_) {
      if (p->state == PathState::kUp && p->peer_max_chunk > 0) {
        limit = std::min(limit, p->peer_max_chunk);
      }
    }
    return std::max<uint64_t>(1, limit);
  }

  // Posts work on free path slots: reposts first, then notifications, then new chunks.
  void Schedule() {
    if (scheduling_) return;
    scheduling_ = true;
    for (;;) {
      if (paths_.empty()) break;
      std::vector<PathView> views = Views();
      if (views.empty()) break;
      if (!repost_.empty()) {
        const uint32_t slot = repost_.front();
        Desc& d = descs_[slot];
        if (d.op->mice) {
          for (PathView& v : views) v.has_slot = true;
        }
        const int p = d.op->mice ? MinRttPath(views) : scheduler_->Pick(views);
        if (p < 0) break;
        repost_.pop_front();
        PostDesc(slot, *paths_[p]);
        continue;
      }
      if (!notify_.empty() && fences_.empty()) {
        Op* op = notify_.front();
        // Notifications go on the lowest-RTT live path, ignoring the chunk cap.
        for (PathView& v : views) v.has_slot = true;
        const int p = MinRttPath(views);
        if (p < 0) break;
        notify_.pop_front();
        const uint32_t slot = AllocDesc();
        Desc& d = descs_[slot];
        d.used = true;
        d.notify = true;
        d.op = op;
        d.chunk = op->chunks;
        ++op->outstanding;
        PostDesc(slot, *paths_[p]);
        continue;
      }
      if (!to_cut_.empty()) {
        Op* op = to_cut_.front();
        if (op->mice && op->kind == OpKind::kSend && op->total > SendChunkLimit()) {
          op->mice = false;  // the peer's receive buffers are smaller than this "mouse"
        }
        // Mice go whole on the lowest-RTT path, past the chunk cap: latency-critical messages
        // should not wait for a slot, and one message cannot use more than one path anyway.
        if (op->mice) {
          for (PathView& v : views) v.has_slot = true;
        }
        const int p = op->mice ? MinRttPath(views) : scheduler_->Pick(views);
        if (p < 0) break;
        uint64_t limit = op->kind == OpKind::kSend ? SendChunkLimit() : chunk_bytes_;
        if (op->mice && op->kind == OpKind::kSend) limit = std::max(limit, op->total);
        const uint64_t length = std::min<uint64_t>(limit, op->total - op->cut);
        const uint32_t slot = AllocDesc();
        Desc& d = descs_[slot];
        d.used = true;
        d.notify = false;
        d.op = op;
        d.chunk = op->chunks++;
        d.offset = op->cut;
        d.length = static_cast<uint32_t>(length);
        op->cut += length;
        ++op->outstanding;
        if (op->cut == op->total) to_cut_.pop_front();
        PostDesc(slot, *paths_[p]);
        continue;
      }
      break;
    }
    scheduling_ = false;
  }

  void PostDesc(uint32_t slot, Path& p) {
    Desc& d = descs_[slot];
    Op& op = *d.op;
    d.path = p.index;
    d.posted = absl::Now();
    if (p.in_flight.empty()) p.last_progress = d.posted;
    p.in_flight.push_back(slot);
    if (!d.notify) {
      ++p.in_flight_chunks;
      p.in_flight_bytes += d.length;
    }
    const uint64_t wr_id = WrId(slot, d.gen);
    if (p.stalled) return;  // test blackhole: the post vanishes
    absl::Status st;
    if (d.notify) {
      Frame f;
      f.type = FrameType::kNotify;
      f.seq = op.seq;
      f.offset = slot;
      f.total = op.total;
      f.send_index = op.kind == OpKind::kSend ? op.send_index : 0;
      f.chunk = op.chunks;
      if (op.kind == OpKind::kWrite) {
        f.flags |= internal::kFlagWrite;
        if (op.immediate) {
          f.flags |= internal::kFlagImmediate;
          f.immediate = *op.immediate;
        }
      }
      internal::EncodeHeader(f, d.header.data());
      st = p.conn->PostSend(pt::ConstBuffer{d.header.data(), kHeaderSize}, wr_id);
    } else if (op.kind == OpKind::kSend) {
      Frame f;
      f.type = FrameType::kChunk;
      f.seq = op.seq;
      f.offset = d.offset;
      f.total = op.total;
      f.send_index = op.send_index;
      f.chunk = d.chunk;
      f.length = d.length;
      f.immediate = slot;
      if (op.mice && d.chunk == 0 && d.length == op.total) f.flags |= internal::kFlagLast;
      internal::EncodeHeader(f, d.header.data());
      const pt::ConstBuffer parts[2] = {{d.header.data(), kHeaderSize},
                                        {op.data + d.offset, d.length}};
      st = p.conn->PostSend(absl::MakeConstSpan(parts, 2), wr_id);
    } else {
      st = p.conn->PostWrite(*op.local, op.local_offset + d.offset, d.length, op.remote,
                             op.remote_offset + d.offset, std::nullopt, wr_id);
    }
    if (!st.ok()) PathFailed(p, base::Annotate(st, "posting a chunk"));
  }

  absl::Status PostRecvBuffer(Path& p, int slot) {
    auto& buf = p.recv_buffers[slot];
    const uint64_t wr_id = kRecvBit | (uint64_t(p.index) << 16) | uint64_t(slot);
    return p.conn->PostRecv(pt::MutableBuffer{buf.data(), buf.size()}, wr_id);
  }

  void SendControl(Path& p, const Frame& f) {
    if (p.state == PathState::kDead || p.stalled) return;
    const uint64_t id = kControlBit | next_control_++;
    auto header = std::make_unique<std::array<uint8_t, kHeaderSize>>(internal::EncodeHeader(f));
    const uint8_t* bytes = header->data();
    control_[id] = std::move(header);
    if (absl::Status st = p.conn->PostSend(pt::ConstBuffer{bytes, kHeaderSize}, id); !st.ok()) {
      control_.erase(id);
      PathFailed(p, base::Annotate(st, "sending a control frame"));
    }
  }

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
  void PathFailed(Path& p, absl::Status why) {
    if (p.state == PathState::kDead) return;
    const bool greeted = p.state == PathState::kUp;
    p.state = PathState::kDead;
    p.error = why.ok() ? absl::UnavailableError("path failed") : std::move(why);
    if (p.conn) p.conn->Close();
    std::vector<uint32_t> moved;
    for (uint32_t slot : p.in_flight) {
      Desc& d = descs_[slot];
      ++d.gen;
      d.path = -1;
      if (d.notify) {
        d.used = false;
        d.op->notify_queued = false;
        --d.op->outstanding;
        Op* op = d.op;
        d.op = nullptr;
        free_descs_.push_back(slot);
        QueueNotify(*op);
        continue;
      }
      ++p.chunks_reposted;
      moved.push_back(slot);
    }
    std::sort(moved.begin(), moved.end(),
              [&](uint32_t a, uint32_t b) { return descs_[a].offset < descs_[b].offset; });
    repost_.insert(repost_.begin(), moved.begin(), moved.end());
    p.in_flight.clear();
    p.in_flight_chunks = 0;
    p.in_flight_bytes = 0;
    if (greeted) fences_[p.index] = true;
    // (Re)announce every open fence: a kPathDown sent on this path may have died with it.
    pending_path_down_.clear();
    for (const auto& [dead, open] : fences_) pending_path_down_.push_back(dead);
    if (LivePaths() == 0 && !have_no_path_since_) have_no_path_since_ = absl::Now();
    SendPathDowns();
  }

  void SendPathDowns() {
    while (!pending_path_down_.empty()) {
      Path* control = ControlPath();
      if (control == nullptr) return;
      const int dead = pending_path_down_.front();
      pending_path_down_.pop_front();
      Frame f;
      f.type = FrameType::kPathDown;
      f.seq = paths_[dead]->peer_index;
      f.offset = static_cast<uint64_t>(dead);
      SendControl(*control, f);
    }
  }

  void Complete(Op& op, absl::Status status) {
    if (op.done) return;
    op.done = true;
    pt::Completion c;
    c.wr_id = op.wr_id;
    c.opcode = op.kind == OpKind::kSend ? pt::Opcode::kSend : pt::Opcode::kWrite;
    c.status = std::move(status);
    c.bytes = op.total;
    c.connection_id = id_;
    user_ready_.push_back(std::move(c));
  }

  // A chunk or notification was acknowledged (Send) or completed (Write chunk).
  void DescDone(uint32_t slot, absl::Time now) {
    Desc& d = descs_[slot];
    Path& p = *paths_[d.path];
    auto it = std::find(p.in_flight.begin(), p.in_flight.end(), slot);
    if (it != p.in_flight.end()) p.in_flight.erase(it);
    p.last_progress = now;
    if (!d.notify) {
      --p.in_flight_chunks;
      p.in_flight_bytes -= d.length;
      p.monitor.OnChunk(d.length, d.posted, now);
      p.bytes_acked += d.length;
      ++p.chunks_acked;
      if (d.length < 4096) p.monitor.OnRtt(now - d.posted);
    } else {
      p.monitor.OnRtt(now - d.posted);
    }
    if (p.in_flight.empty()) p.monitor.OnIdle();
    Op& op = *d.op;
    const bool was_notify = d.notify;
    const bool last_flag =
        !d.notify && op.kind == OpKind::kSend && op.mice && d.chunk == 0 && d.length == op.total;
    FreeDesc(slot);
    --op.outstanding;
    if (was_notify || last_flag) {
      Complete(op, absl::OkStatus());
      ops_.erase(op.seq);
      return;
    }
    if (op.cut == op.total && op.outstanding == 0) QueueNotify(op);
  }

  void OnFrame(Path& p, const Frame& f, absl::Span<const uint8_t> payload) {
    p.last_progress = p.last_heard = absl::Now();
    switch (f.type) {
      case FrameType::kHello:
        if (p.state == PathState::kGreeting) {
          p.state = PathState::kUp;
          p.peer_index = f.seq;
          p.peer_max_chunk = f.total;
          have_no_path_since_.reset();
          SendPathDowns();
        }
        break;
      case FrameType::kChunk: {
        bool duplicate = false;
        if (absl::Status st = reassembler_.OnChunk(f, payload, &duplicate); !st.ok()) {
          Fail(st);
          return;
        }
        Frame ack;
        ack.type = FrameType::kAck;
        ack.seq = f.seq;
        ack.chunk = f.chunk;
        ack.offset = f.immediate;
        SendControl(p, ack);
        MaybeSignalOverload(p);
        break;
      }
      case FrameType::kNotify: {
        bool duplicate = false;
        if (absl::Status st = reassembler_.OnNotify(f, &duplicate); !st.ok()) {
          Fail(st);
          return;
        }
        Frame ack;
        ack.type = FrameType::kAck;
        ack.flags = internal::kFlagNotify;
        ack.seq = f.seq;
        ack.chunk = f.chunk;
        ack.offset = f.offset;
        SendControl(p, ack);
        break;
      }
      case FrameType::kAck: {
        if (f.offset >= descs_.size()) break;
        const uint32_t slot = static_cast<uint32_t>(f.offset);
        Desc& d = descs_[slot];
        const bool notify = (f.flags & internal::kFlagNotify) != 0;
        if (!d.used || d.op == nullptr || d.op->seq != f.seq || d.notify != notify ||
            (!notify && d.chunk != f.chunk) || d.path != p.index) {
          break;  // stale: the descriptor was reposted or finished
        }
        DescDone(slot, absl::Now());
        break;
      }
      case FrameType::kProbe: {
        Frame reply = f;
        reply.type = FrameType::kProbeReply;
        SendControl(p, reply);
        break;
      }
      case FrameType::kProbeReply:
        if (p.probe_outstanding && f.seq == p.probe_id) {
          p.probe_outstanding = false;
          const absl::Time now = absl::Now();
          p.monitor.OnRtt(now - p.probe_sent);
          const absl::Duration own_queue =
              p.monitor.bandwidth() > 0
                  ? absl::Seconds(static_cast<double>(p.in_flight_bytes) / p.monitor.bandwidth())
                  : absl::ZeroDuration();
          if (p.monitor.Inflated(options_.congestion_rtt_factor, options_.congestion_rtt_slack,
                                 own_queue) &&
              now - p.last_signal > std::max(Rtt(p), options_.probe_interval)) {
            p.rate.OnCongestion();
            ++p.congestion_signals;
            p.last_signal = now;
          }
        }
        break;
      case FrameType::kPathDown: {
        if (f.seq < paths_.size()) {
          PathFailed(*paths_[f.seq], absl::UnavailableError("the peer declared this path dead"));
        }
        Frame ack;
        ack.type = FrameType::kPathDownAck;
        ack.seq = f.offset;
        SendControl(p, ack);
        break;
      }
      case FrameType::kPathDownAck:
        fences_.erase(static_cast<int>(f.seq));
        break;
      case FrameType::kOverload: {
        const absl::Time now = absl::Now();
        if (now - last_overload_ > options_.probe_interval) {
          last_overload_ = now;
          for (auto& q : paths_) q->rate.OnOverload();
          for (auto& q : paths_) q->last_signal = now;
        }
        break;
      }
    }
  }

  void MaybeSignalOverload(Path& p) {
    if (reassembler_.held_bytes() <= options_.max_held_bytes / 2) return;
    const absl::Time now = absl::Now();
    if (now - last_overload_sent_ < options_.probe_interval) return;
    last_overload_sent_ = now;
    ++overload_signals_;
    Frame f;
    f.type = FrameType::kOverload;
    SendControl(p, f);
  }

  // The channel cannot go on (a broken peer, or held bytes over the cap).
  void Fail(absl::Status why) {
    if (!failed_.ok()) return;
    failed_ = why;
    for (auto& p : paths_) PathFailed(*p, why);
    for (auto& [seq, op] : ops_) Complete(*op, why);
    reassembler_.CancelRecvs(why);
    for (uint32_t slot : repost_) FreeDesc(slot);
    ops_.clear();
    to_cut_.clear();
    notify_.clear();
    repost_.clear();
  }

  void HandleCompletion(const pt::Completion& c) {
    auto pit = by_connection_.find(c.connection_id);
    if (pit == by_connection_.end()) return;  // a wake-up
    Path& p = *paths_[pit->second];
    if ((c.wr_id & kControlBit) != 0) {
      control_.erase(c.wr_id);
      if (!c.status.ok()) PathFailed(p, c.status);
      return;
    }
    if ((c.wr_id & kRecvBit) != 0) {
      if (p.state == PathState::kDead) return;
      if (p.stalled && c.status.ok()) {  // test blackhole: inbound frames vanish too
        if (absl::Status st = PostRecvBuffer(p, static_cast<int>(c.wr_id & 0xffff)); !st.ok()) {
          PathFailed(p, st);
        }
        return;
      }
      if (!c.status.ok()) {
        PathFailed(p, c.status);
        return;
      }
      const int slot = static_cast<int>(c.wr_id & 0xffff);
      const auto& buf = p.recv_buffers[slot];
      auto frame =
          internal::DecodeFrame(absl::MakeConstSpan(buf.data(), c.bytes), uint64_t{1} << 40);
      if (!frame.ok()) {
        PathFailed(p, base::Annotate(frame.status(), absl::StrCat("from ", p.peer)));
        return;
      }
      OnFrame(p, *frame, absl::MakeConstSpan(buf.data() + kHeaderSize, c.bytes - kHeaderSize));
      if (p.state != PathState::kDead) {
        if (absl::Status st = PostRecvBuffer(p, slot); !st.ok()) PathFailed(p, st);
      }
      return;
    }
    const uint32_t slot = static_cast<uint32_t>(c.wr_id & 0xffffffffu);
    const uint32_t gen = static_cast<uint32_t>(c.wr_id >> 32);
    if (slot >= descs_.size() || descs_[slot].gen != gen || !descs_[slot].used) return;  // stale
    if (!c.status.ok()) {
      PathFailed(p, c.status);
      return;
    }
    // A Write chunk is in place when the transport completes it; Send chunks and notifications
    // wait for the receiver's ack.
    if (c.opcode == pt::Opcode::kWrite) {
      p.last_heard = absl::Now();
      DescDone(slot, p.last_heard);
    }
  }

  void Timers(absl::Time now) {
    // A path is declared dead by silence only while another path shows the peer is alive and
    // this side is being scheduled: when every path is silent at once, this process or the
    // peer stalled (or every path broke, which the transport's own timeouts report).
    absl::Time freshest = absl::InfinitePast();
    for (const auto& path : paths_) {
      if (path->state == PathState::kUp) freshest = std::max(freshest, path->last_heard);
    }
    const bool peer_alive = now - freshest <= path_timeout_;
    for (auto& path : paths_) {
      Path& p = *path;
      if (p.state == PathState::kDead) continue;
      const bool busy = !p.in_flight.empty() || p.probe_outstanding;
      if (busy && peer_alive && now - p.last_progress > path_timeout_) {
        PathFailed(p, absl::DeadlineExceededError(absl::StrCat(
                          "multipath path ", p.index, " to ", p.peer, ": no progress for ",
                          absl::FormatDuration(now - p.last_progress), " (path_timeout ",
                          absl::FormatDuration(path_timeout_), ")")));
        continue;
      }
      if (p.state != PathState::kUp) continue;
      if (now - p.last_tick >= options_.probe_interval) {
        p.last_tick = now;
        p.load_snapshot = p.monitor.bandwidth() > 0
                              ? static_cast<double>(p.in_flight_bytes) / p.monitor.bandwidth()
                              : static_cast<double>(p.in_flight_chunks);
        if (now - p.last_signal >= options_.probe_interval) p.rate.Tick();
      }
      if (!p.probe_outstanding && now - p.last_probe >= options_.probe_interval) {
        Frame f;
        f.type = FrameType::kProbe;
        f.seq = ++p.probe_id;
        p.probe_outstanding = true;
        p.probe_sent = now;
        p.last_probe = now;
        if (p.in_flight.empty()) p.last_progress = now;
        SendControl(p, f);
      }
    }
    if (have_no_path_since_ && !ops_.empty() && now - *have_no_path_since_ > no_path_limit_) {
      for (auto& [seq, op] : ops_) {
        Complete(*op, absl::UnavailableError(absl::StrCat("multipath: no live path for ",
                                                          absl::FormatDuration(no_path_limit_))));
      }
      ops_.clear();
      to_cut_.clear();
      notify_.clear();
      for (uint32_t slot : repost_) FreeDesc(slot);
      repost_.clear();
    }
  }

  void FlushReceiver() {
    for (pt::Completion& c : reassembler_.TakeCompletions()) {
      c.connection_id = id_;
      user_ready_.push_back(std::move(c));
    }
  }

  void FlushUser() {
    for (pt::Completion& c : user_ready_) user_cq_->Push(std::move(c));
    user_ready_.clear();
  }

  void Run() {
    std::vector<pt::Completion> batch(64);
    for (;;) {
      size_t n = path_cq_.Poll(absl::MakeSpan(batch));
      if (n == 0) {
        auto c = path_cq_.Wait(absl::Milliseconds(2), absl::ZeroDuration());
        if (c.ok()) {
          batch[0] = std::move(*c);
          n = 1 + path_cq_.Poll(absl::MakeSpan(batch).subspan(1));
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      for (size_t i = 0; i < n; ++i) HandleCompletion(batch[i]);
      // Drain what queued up meanwhile before judging timeouts: after this thread was starved,
      // a backlog of completions is progress, not silence.
      for (int rounds = 0; n == batch.size() && rounds < 64; ++rounds) {
        n = path_cq_.Poll(absl::MakeSpan(batch));
        for (size_t i = 0; i < n; ++i) HandleCompletion(batch[i]);
      }
      Timers(absl::Now());
      Schedule();
      SendPathDowns();
      FlushReceiver();
      FlushUser();
    }
  }

  const ChannelOptions options_;
  const absl::Duration path_timeout_;
  const absl::Duration no_path_limit_ = absl::Seconds(30);
  pt::CompletionQueue* const user_cq_;
  const uint64_t id_;
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
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<MultipathChannel>> MultipathChannel::Create(
    const ChannelOptions& options, pt::CompletionQueue* user_cq) {
  if (user_cq == nullptr) return absl::InvalidArgumentError("multipath: null completion queue");
  if (options.max_chunk_bytes == 0 || options.max_chunk_bytes > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "multipath: max_chunk_bytes must be in [1, 1 GiB], got ", options.max_chunk_bytes));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes > options.max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("multipath: chunk_bytes must be in [1, ",
                                                   options.max_chunk_bytes, "], got ",
                                                   options.chunk_bytes));
  }
  if (options.max_chunks_in_flight < 1 || options.max_chunks_in_flight > kMaxInFlightCap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "multipath: max_chunks_in_flight must be in [1, 8], got ", options.max_chunks_in_flight));
  }
  if (options.mice_bytes > options.max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("multipath: mice_bytes (", options.mice_bytes,
                                                   ") must not exceed max_chunk_bytes (",
                                                   options.max_chunk_bytes, ")"));
  }
  if (options.probe_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("multipath: probe_interval must be positive");
  }
  PLEXUS_ASSIGN_OR_RETURN(
      absl::Duration timeout,
      kPathTimeoutParam.Resolve(options.path_timeout > absl::ZeroDuration()
                                    ? std::optional<absl::Duration>(options.path_timeout)
                                    : std::nullopt));
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("multipath: path timeout must be positive");
  }
  return std::unique_ptr<MultipathChannel>(
      new MultipathChannel(std::make_unique<Impl>(options, timeout, user_cq)));
}

MultipathChannel::MultipathChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MultipathChannel::~MultipathChannel() = default;

pt::CompletionQueue* MultipathChannel::path_queue() { return impl_->path_queue(); }
absl::StatusOr<int> MultipathChannel::AddPath(std::unique_ptr<pt::Connection> connection) {
  return impl_->AddPath(std::move(connection));
}
absl::Status MultipathChannel::Send(pt::ConstBuffer buffer, uint64_t wr_id) {
  return impl_->Send(buffer, wr_id);
}
absl::Status MultipathChannel::Recv(pt::MutableBuffer buffer, uint64_t wr_id) {
  return impl_->Recv(buffer, wr_id);
}
absl::Status MultipathChannel::Write(const pt::MemoryRegion& local, size_t local_offset,
                                     size_t length, const pt::RegionHandle& remote,
                                     size_t remote_offset, std::optional<uint32_t> immediate,
                                     uint64_t wr_id) {
  return impl_->Write(local, local_offset, length, remote, remote_offset, immediate, wr_id);
}
absl::Status MultipathChannel::SetChunkBytes(size_t bytes) { return impl_->SetChunkBytes(bytes); }
absl::Status MultipathChannel::SetMaxChunksInFlight(int chunks) {
  return impl_->SetMaxChunksInFlight(chunks);
}
void MultipathChannel::SetScheduler(SchedulerKind kind) { impl_->SetScheduler(kind); }
SchedulerKind MultipathChannel::scheduler() const { return impl_->scheduler(); }
ChannelStats MultipathChannel::Stats() const { return impl_->Stats(); }
int MultipathChannel::live_paths() const { return impl_->live_paths(); }
absl::Status MultipathChannel::status() const { return impl_->status(); }
uint64_t MultipathChannel::id() const { return impl_->id(); }
void MultipathChannel::FailPathForTest(int path) {
  impl_->FailPath(path, absl::UnavailableError("path killed by a test"));
}
void MultipathChannel::StallPathForTest(int path) { impl_->StallPath(path); }
void MultipathChannel::SetPathRttForTest(int path, absl::Duration rtt) { impl_->PinRtt(path, rtt); }

}  // namespace plexus::multipath
