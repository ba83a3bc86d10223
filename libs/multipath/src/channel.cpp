// MultipathChannel: the public calls, the progress thread and Create (channel_impl.hpp).
#include "channel_impl.hpp"
#include "channel_test_access.hpp"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"

namespace plexus::multipath {

namespace {

const base::Param<absl::Duration> kPathTimeoutParam(
    "PLEXUS_MULTIPATH_PATH_TIMEOUT", absl::Milliseconds(100),
    "a multipath path with work outstanding and no completion for this long is declared dead");

}  // namespace

MultipathChannel::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  revive_cv_.notify_all();
  path_cq_.Push(pt::Completion{});  // wake the thread
  thread_.join();
  if (revive_thread_.joinable()) revive_thread_.join();
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

absl::StatusOr<int> MultipathChannel::Impl::AddPathLocked(std::unique_ptr<pt::Connection> conn,
                                                          int lane) {
  if (conn == nullptr) return absl::InvalidArgumentError("AddPath: null connection");
  if (!conn->status().ok()) {
    return base::Annotate(conn->status(), "AddPath: the connection is already down");
  }
  PLEXUS_RETURN_IF_ERROR(failed_);
  if (paths_.size() >= 0xffff) return absl::ResourceExhaustedError("AddPath: too many paths");
  auto path = std::make_unique<Path>();
  path->index = static_cast<int>(paths_.size());
  if (lane < 0) {
    lane = static_cast<int>(lanes_.size());
    lanes_.push_back(Lane{absl::InfinitePast(), base::Backoff(options_.reconnect_backoff,
                                                              options_.max_reconnect_backoff)});
  }
  path->lane = lane;
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

absl::Status MultipathChannel::Impl::Send(absl::Span<const pt::ConstBuffer> buffers,
                                          uint64_t wr_id) {
  auto op = std::make_unique<Op>();
  uint64_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size == 0) continue;
    if (buffers[i].data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Send: buffer ", i, " of ", buffers.size(),
                                                     " is null with size ", buffers[i].size));
    }
    total += buffers[i].size;
    op->parts.push_back(buffers[i]);
    op->part_end.push_back(total);
  }
  std::lock_guard<std::mutex> lock(mu_);
  PLEXUS_RETURN_IF_ERROR(failed_);
  op->kind = OpKind::kSend;
  op->wr_id = wr_id;
  op->total = total;
  op->send_index = next_send_index_++;
  Enqueue(std::move(op));
  return absl::OkStatus();
}

absl::Status MultipathChannel::Impl::Recv(pt::MutableBuffer buffer, uint64_t wr_id) {
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

absl::Status MultipathChannel::Impl::SetChunkBytes(size_t bytes) {
  if (bytes == 0 || bytes > options_.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk bytes must be in [1, ", options_.max_chunk_bytes, "], got ", bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  chunk_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status MultipathChannel::Impl::SetMaxChunksInFlight(int chunks) {
  if (chunks < 1 || chunks > kMaxInFlightCap) {
    return absl::InvalidArgumentError(absl::StrCat("chunks in flight per path must be in [1, ",
                                                   kMaxInFlightCap, "], got ", chunks));
  }
  std::lock_guard<std::mutex> lock(mu_);
  cap_ = chunks;
  Schedule();
  return absl::OkStatus();
}

ChannelStats MultipathChannel::Impl::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ChannelStats out;
  out.duplicates_dropped = reassembler_.duplicates();
  out.overload_signals = overload_signals_;
  out.paths_revived = paths_revived_;
  out.acks_sent_ahead = acks_sent_ahead_;
  out.last_redial_error = last_redial_error_;
  for (const auto& path : paths_) {
    const Path& p = *path;
    PathStats s;
    s.index = p.index;
    s.lane = p.lane;
    s.up = p.state == PathState::kUp;
    s.greeted = p.greeted;
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

void MultipathChannel::Impl::Run() {
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
    ReapDeadPaths();
    FlushReceiver();
    FlushUser();
  }
}

absl::StatusOr<std::unique_ptr<MultipathChannel>> MultipathChannel::Create(
    const ChannelOptions& options, pt::CompletionQueue* user_cq) {
  return internal::ChannelFactory::Create(options, user_cq, internal::ChannelInternalOptions{});
}

absl::StatusOr<std::unique_ptr<MultipathChannel>> internal::ChannelFactory::Create(
    const ChannelOptions& options, pt::CompletionQueue* user_cq,
    const ChannelInternalOptions& internal_options) {
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
    return absl::InvalidArgumentError(
        absl::StrCat("multipath: max_chunks_in_flight must be in [1, ", kMaxInFlightCap, "], got ",
                     options.max_chunks_in_flight));
  }
  if (options.mice_bytes > options.max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("multipath: mice_bytes (", options.mice_bytes,
                                                   ") must not exceed max_chunk_bytes (",
                                                   options.max_chunk_bytes, ")"));
  }
  if (options.reconnect_backoff <= absl::ZeroDuration() ||
      options.max_reconnect_backoff < options.reconnect_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "multipath: reconnect_backoff (", absl::FormatDuration(options.reconnect_backoff),
        ") must be > 0 and <= max_reconnect_backoff (",
        absl::FormatDuration(options.max_reconnect_backoff), ")"));
  }
  if (options.probe_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("multipath: probe_interval must be positive");
  }
  if (options.silence_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("multipath: silence_timeout must be positive, got ",
                     absl::FormatDuration(options.silence_timeout)));
  }
  PLEXUS_ASSIGN_OR_RETURN(
      absl::Duration timeout,
      kPathTimeoutParam.Resolve(options.path_timeout > absl::ZeroDuration()
                                    ? std::optional<absl::Duration>(options.path_timeout)
                                    : std::nullopt));
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("multipath: path timeout must be positive");
  }
  std::unique_ptr<Scheduler> scheduler;
  if (options.make_scheduler) {
    scheduler = options.make_scheduler();
    if (scheduler == nullptr) {
      return absl::InvalidArgumentError("multipath: ChannelOptions::make_scheduler returned null");
    }
  } else {
    PLEXUS_ASSIGN_OR_RETURN(scheduler, MakeScheduler(options.scheduler));
  }
  return std::unique_ptr<MultipathChannel>(
      new MultipathChannel(std::make_unique<MultipathChannel::Impl>(
          options, timeout, user_cq, internal_options, std::move(scheduler))));
}

MultipathChannel::MultipathChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MultipathChannel::~MultipathChannel() = default;

pt::CompletionQueue* MultipathChannel::path_queue() { return impl_->path_queue(); }
absl::StatusOr<int> MultipathChannel::AddPath(std::unique_ptr<pt::Connection> connection) {
  return impl_->AddPath(std::move(connection));
}
absl::Status MultipathChannel::Send(pt::ConstBuffer buffer, uint64_t wr_id) {
  return impl_->Send(absl::MakeConstSpan(&buffer, 1), wr_id);
}
absl::Status MultipathChannel::Send(absl::Span<const pt::ConstBuffer> buffers, uint64_t wr_id) {
  return impl_->Send(buffers, wr_id);
}
void MultipathChannel::Close() { impl_->Close(); }
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
absl::Status MultipathChannel::SetScheduler(std::string_view name) {
  return impl_->SetScheduler(name);
}
absl::Status MultipathChannel::SetScheduler(std::unique_ptr<Scheduler> scheduler) {
  return impl_->SetScheduler(std::move(scheduler));
}
std::string MultipathChannel::scheduler() const { return impl_->scheduler(); }
ChannelStats MultipathChannel::Stats() const { return impl_->Stats(); }
int MultipathChannel::live_paths() const { return impl_->live_paths(); }
absl::Status MultipathChannel::status() const { return impl_->status(); }
uint64_t MultipathChannel::id() const { return impl_->id(); }
void internal::ChannelTestAccess::FailPath(MultipathChannel& channel, int path) {
  channel.impl_->FailPath(path, absl::UnavailableError("path killed by a test"));
}
void internal::ChannelTestAccess::StallPath(MultipathChannel& channel, int path) {
  channel.impl_->StallPath(path);
}
void internal::ChannelTestAccess::SetPathRtt(MultipathChannel& channel, int path,
                                             absl::Duration rtt) {
  channel.impl_->PinRtt(path, rtt);
}

}  // namespace plexus::multipath
