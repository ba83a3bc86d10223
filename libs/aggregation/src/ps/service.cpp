// The tall parameter server: one thread per core, each with its own listener, completion queue,
// connections and chunks. Nothing on the data path is shared between cores.
#include "plexus/aggregation/service.hpp"

#include <atomic>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "buffers.hpp"
#include "kernels.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/accept_loop.hpp"
#include "plexus/transport/device.hpp"
#include "wire.hpp"

namespace plexus::aggregation {
namespace internal {
namespace {

using transport::Completion;
using transport::Connection;
using transport::Opcode;

constexpr int kRecvsPerConnection = 8;

struct Namespace {
  uint32_t id = 0;
  uint64_t nonce = 0;
  NamespaceOptions options;
};

struct ServerConn {
  std::vector<AlignedBytes> recv;  // declared first: outlives the connection that fills it
  std::unique_ptr<Connection> conn;
  std::shared_ptr<const Namespace> ns;  // null until its hello
  int worker = -1;
  int index = -1;
  bool dead = false;
  std::string peer;
};

struct ChunkState {
  size_t elements = 0;
  DataType dtype = DataType::kF32;
  size_t wire_bytes = 0;
  AlignedBytes w, g, m, v;  // f32 master weights, merge buffer, optimizer state
  AlignedBytes out[2];      // frame header + values in the wire type; out[read] is current
  int read = 0;
  uint64_t round = 0;  // rounds completed
  int count = 0;       // gradients summed in the current round
  std::vector<uint8_t> pushed;
  absl::Time started;
  std::vector<ServerConn*> worker_conn;  // the connection each worker keeps this chunk on
};

struct CoreNamespace {
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, ChunkState> chunks;
  // (worker, connection index) -> the connection that said hello as it: a second client for a
  // worker that is still connected is refused rather than allowed to take over its replies.
  absl::flat_hash_map<std::pair<int, int>, ServerConn*> joined;
  std::vector<std::string> gone;  // per worker: why it is gone ("" while alive)
  int active = 0;                 // chunks with a round in progress
};

class ServiceImpl;

class Core {
 public:
  Core(ServiceImpl* service, int index) : service_(service), index_(index) {}
  absl::Status Start(transport::Device& device, const std::string& address);
  void Stop();
  std::string address() const { return listener_->address(); }

 private:
  void AcceptLoop();
  void Loop();
  void Adopt();
  void HandleRecv(ServerConn* c, size_t slot, size_t bytes);
  void HandleFrame(ServerConn* c, const FrameView& f);
  void HandleHello(ServerConn* c, const FrameView& f);
  void HandleInit(ServerConn* c, CoreNamespace& cns, const FrameView& f);
  void HandlePush(ServerConn* c, CoreNamespace& cns, const FrameView& f);
  void Complete(const Namespace& ns, CoreNamespace& cns, uint64_t key, uint32_t chunk,
                ChunkState& st);
  void FailRound(CoreNamespace& cns, uint64_t key, uint32_t chunk, ChunkState& st,
                 const absl::Status& why);
  void WorkerGone(ServerConn* c, const absl::Status& why);
  void CheckTimeouts();
  void SendValues(ServerConn* c, const ChunkState& st);
  void SendControl(ServerConn* c, FrameHeader h, absl::Span<const uint8_t> payload);
  void SendError(ServerConn* c, const FrameHeader& about, const absl::Status& status);
  void Repost(ServerConn* c, size_t slot);

  ServiceImpl* service_;
  int index_;
  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<transport::CompletionQueue> cq_;
  std::thread accept_thread_, loop_thread_;
  std::atomic<bool> stop_{false};
  std::mutex pending_mu_;  // control path only: accepted connections waiting to be adopted
  std::vector<std::unique_ptr<Connection>> pending_;
  // Core-local from here on: touched by the loop thread only.
  absl::flat_hash_map<uint64_t, std::unique_ptr<ServerConn>> conns_;
  absl::flat_hash_map<uint32_t, CoreNamespace> namespaces_;
  absl::flat_hash_map<uint64_t, std::vector<uint8_t>> control_sends_;
  uint64_t next_send_id_ = 1;
  size_t recv_bytes_ = 0;  // the largest frame a worker may send: an init of the largest chunk
};

class ServiceImpl : public Service {
 public:
  explicit ServiceImpl(ServiceOptions options) : options_(std::move(options)) {}
  ~ServiceImpl() override { Shutdown(); }

  absl::Status Start() {
    if (options_.cores < 1) return absl::InvalidArgumentError("ServiceOptions.cores must be >= 1");
    if (options_.max_chunk_bytes < 4 || options_.max_chunk_bytes > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("ServiceOptions.max_chunk_bytes ",
                                                     options_.max_chunk_bytes, " is outside [4, ",
                                                     kMaxChunkBytes, "]"));
    }
    if (!options_.listen_addresses.empty() &&
        static_cast<int>(options_.listen_addresses.size()) != options_.cores) {
      return absl::InvalidArgumentError(
          absl::StrCat("ServiceOptions.listen_addresses has ", options_.listen_addresses.size(),
                       " addresses for ", options_.cores, " cores: give one per core or none"));
    }
    transport::DeviceOptions dopts;
    dopts.backend = options_.backend;
    dopts.op_timeout = options_.op_timeout;
    dopts.tcp = options_.tcp;
    if (options_.backend == transport::Backend::kTcp) dopts.local_address = "127.0.0.1";
    PLEXUS_ASSIGN_OR_RETURN(device_, transport::Device::Create(dopts));
    for (int i = 0; i < options_.cores; ++i) {
      cores_.push_back(std::make_unique<Core>(this, i));
      const std::string addr =
          options_.listen_addresses.empty() ? "" : options_.listen_addresses[i];
      PLEXUS_RETURN_IF_ERROR(
          base::Annotate(cores_.back()->Start(*device_, addr), absl::StrCat("core ", i)));
    }
    return absl::OkStatus();
  }

  std::vector<std::string> addresses() const override {
    std::vector<std::string> out;
    for (const auto& c : cores_) out.push_back(c->address());
    return out;
  }

  absl::StatusOr<NamespaceInfo> CreateNamespace(const NamespaceOptions& o) override {
    if (o.workers < 1 || o.workers > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace \"", o.name, "\": workers = ", o.workers, ", expected 1..65536"));
    }
    if (o.chunk_bytes < 4 || o.chunk_bytes > options_.max_chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace \"", o.name, "\": chunk_bytes ", o.chunk_bytes,
          " is outside [4, ServiceOptions.max_chunk_bytes = ", options_.max_chunk_bytes, "]"));
    }
    PLEXUS_RETURN_IF_ERROR(
        base::Annotate(ValidateOptimizer(o.optimizer), absl::StrCat("namespace \"", o.name, "\"")));
    auto ns = std::make_shared<Namespace>();
    ns->options = o;
    std::random_device rd;
    ns->nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ absl::ToUnixNanos(absl::Now());
    std::lock_guard<std::mutex> lock(mu_);
    ns->id = next_ns_++;
    namespaces_[ns->id] = ns;
    return NamespaceInfo{ns->id, ns->nonce};
  }

  std::shared_ptr<const Namespace> FindNamespace(uint32_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = namespaces_.find(id);
    return it == namespaces_.end() ? nullptr : it->second;
  }

  size_t memory_used() const override { return memory_used_.load(); }

  bool Reserve(size_t bytes) {
    size_t used = memory_used_.load();
    do {
      if (used + bytes > options_.memory_budget_bytes) return false;
    } while (!memory_used_.compare_exchange_weak(used, used + bytes));
    return true;
  }

  void Shutdown() override {
    for (auto& c : cores_) c->Stop();
    cores_.clear();
  }

  const ServiceOptions& options() const { return options_; }
  static constexpr size_t kMaxChunkBytes = size_t{4} << 20;

 private:
  ServiceOptions options_;
  std::shared_ptr<transport::Device> device_;
  std::vector<std::unique_ptr<Core>> cores_;
  std::atomic<size_t> memory_used_{0};
  std::mutex mu_;  // namespaces (control path)
  absl::flat_hash_map<uint32_t, std::shared_ptr<Namespace>> namespaces_;
  uint32_t next_ns_ = 1;
};

absl::Status Core::Start(transport::Device& device, const std::string& address) {
  recv_bytes_ = kHeaderBytes + kInitPrefixBytes + service_->options().max_chunk_bytes;
  PLEXUS_ASSIGN_OR_RETURN(listener_, device.Listen(address));
  cq_ = device.CreateCompletionQueue();
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  loop_thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Core::Stop() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  if (loop_thread_.joinable()) loop_thread_.join();
  for (auto& [id, c] : conns_) c->conn->Close();
  std::lock_guard<std::mutex> lock(pending_mu_);
  for (auto& c : pending_) c->Close();
}

void Core::AcceptLoop() {
  transport::AcceptUntil(*listener_, stop_, cq_.get(), [this](std::unique_ptr<Connection> conn) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_.push_back(std::move(conn));
  });
}

void Core::Adopt() {
  std::vector<std::unique_ptr<Connection>> fresh;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    fresh.swap(pending_);
  }
  for (auto& conn : fresh) {
    auto c = std::make_unique<ServerConn>();
    c->peer = conn->peer_address();
    c->conn = std::move(conn);
    ServerConn* raw = c.get();
    conns_[raw->conn->id()] = std::move(c);
    for (int i = 0; i < kRecvsPerConnection; ++i) {
      raw->recv.push_back(AllocAligned(recv_bytes_));
      Repost(raw, i);
    }
  }
}

void Core::Repost(ServerConn* c, size_t slot) {
  if (c->dead) return;
  absl::Status st = c->conn->PostRecv({c->recv[slot].get(), recv_bytes_}, slot);
  if (!st.ok()) WorkerGone(c, st);
}

void Core::Loop() {
  Completion batch[32];
  absl::Time last_check = absl::Now();
  while (!stop_) {
    Adopt();
    size_t n = cq_->Poll(absl::MakeSpan(batch));
    if (n == 0) {
      auto one = cq_->Wait(absl::Milliseconds(20));
      if (one.ok()) {
        batch[0] = *std::move(one);
        n = 1;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const Completion& comp = batch[i];
      if (comp.opcode == Opcode::kSend) {
        if (comp.wr_id != 0) control_sends_.erase(comp.wr_id);
        continue;
      }
      auto it = conns_.find(comp.connection_id);
      if (it == conns_.end()) continue;
      ServerConn* c = it->second.get();
      if (!comp.status.ok()) {
        WorkerGone(c, comp.status);
        continue;
      }
      if (comp.opcode == Opcode::kRecv) HandleRecv(c, comp.wr_id, comp.bytes);
    }
    const absl::Time now = absl::Now();
    if (now - last_check >= absl::Milliseconds(20)) {
      last_check = now;
      CheckTimeouts();
    }
  }
}

void Core::HandleRecv(ServerConn* c, size_t slot, size_t bytes) {
  auto frame = DecodeFrame(absl::MakeConstSpan(c->recv[slot].get(), bytes));
  if (!frame.ok()) {
    SendError(c, FrameHeader{}, frame.status());
  } else {
    HandleFrame(c, *frame);
  }
  Repost(c, slot);
}

void Core::HandleFrame(ServerConn* c, const FrameView& f) {
  const FrameHeader& h = f.header;
  if (h.type == FrameType::kHello) return HandleHello(c, f);
  if (c->ns == nullptr) {
    return SendError(c, h,
                     absl::FailedPreconditionError(
                         absl::StrCat(FrameTypeName(h.type), " before hello refused")));
  }
  if (h.ns != c->ns->id || h.nonce != c->ns->nonce ||
      h.worker != static_cast<uint32_t>(c->worker)) {
    return SendError(c, h,
                     absl::PermissionDeniedError(absl::StrCat(
                         FrameTypeName(h.type), " for namespace ", h.ns, " worker ", h.worker,
                         " refused: this connection belongs to namespace ", c->ns->id, " worker ",
                         c->worker, " (wrong namespace, worker or nonce)")));
  }
  CoreNamespace& cns = namespaces_[c->ns->id];
  switch (h.type) {
    case FrameType::kInit:
      return HandleInit(c, cns, f);
    case FrameType::kPush:
      return HandlePush(c, cns, f);
    case FrameType::kPull: {
      auto it = cns.chunks.find({h.key, h.chunk});
      if (it == cns.chunks.end()) {
        return SendError(
            c, h,
            absl::NotFoundError(absl::StrCat("pull of key ", h.key, " chunk ", h.chunk,
                                             ": not initialised on server core ", index_)));
      }
      return SendValues(c, it->second);
    }
    default:
      return SendError(c, h,
                       absl::InvalidArgumentError(absl::StrCat("a worker may not send ",
                                                               FrameTypeName(h.type), " frames")));
  }
}

void Core::HandleHello(ServerConn* c, const FrameView& f) {
  const FrameHeader& h = f.header;
  if (c->ns != nullptr) {
    return SendError(c, h, absl::FailedPreconditionError("second hello on a connection refused"));
  }
  auto ns = service_->FindNamespace(h.ns);
  if (ns == nullptr || ns->nonce != h.nonce) {
    return SendError(
        c, h,
        absl::PermissionDeniedError(absl::StrCat("hello for namespace ", h.ns,
                                                 " refused: no such namespace, or a wrong nonce")));
  }
  if (h.worker >= static_cast<uint32_t>(ns->options.workers)) {
    return SendError(c, h,
                     absl::InvalidArgumentError(absl::StrCat(
                         "hello from worker ", h.worker, ": namespace \"", ns->options.name,
                         "\" has ", ns->options.workers, " workers")));
  }
  CoreNamespace& cns = namespaces_[ns->id];
  if (cns.gone.empty()) cns.gone.resize(ns->options.workers);
  const uint8_t* p = f.payload.data();
  const int index =
      static_cast<int>(p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24);
  ServerConn*& joined = cns.joined[{static_cast<int>(h.worker), index}];
  if (joined != nullptr && !joined->dead) {
    return SendError(
        c, h,
        absl::AlreadyExistsError(absl::StrCat(
            "hello from worker ", h.worker, " (connection ", index, ") of namespace \"",
            ns->options.name, "\" refused: that worker is already connected from ", joined->peer,
            "; two jobs share the namespace and its nonce, or a worker started twice")));
  }
  joined = c;
  c->ns = ns;
  c->worker = static_cast<int>(h.worker);
  c->index = index;
  FrameHeader ack = h;
  ack.type = FrameType::kHelloAck;
  uint8_t payload[8] = {};
  const uint32_t cores = static_cast<uint32_t>(service_->options().cores);
  const uint32_t workers = static_cast<uint32_t>(ns->options.workers);
  std::memcpy(payload, &cores, 4);
  std::memcpy(payload + 4, &workers, 4);
  SendControl(c, ack, payload);
}

void Core::HandleInit(ServerConn* c, CoreNamespace& cns, const FrameView& f) {
  const FrameHeader& h = f.header;
  const Namespace& ns = *c->ns;
  uint64_t key_elements = 0, offset = 0;
  std::memcpy(&key_elements, f.payload.data(), 8);
  std::memcpy(&offset, f.payload.data() + 8, 8);
  const size_t esize = collectives::DataTypeSize(h.dtype);
  const size_t elements = (f.payload.size() - kInitPrefixBytes) / esize;
  auto chunks = SplitKey(h.key, key_elements, esize, ns.options.chunk_bytes);
  if (!chunks.ok()) return SendError(c, h, chunks.status());
  if (h.chunk >= chunks->size() || (*chunks)[h.chunk].offset != offset ||
      (*chunks)[h.chunk].elements != elements) {
    return SendError(c, h,
                     absl::InvalidArgumentError(absl::StrCat(
                         "init of key ", h.key, " chunk ", h.chunk, " (offset ", offset, ", ",
                         elements, " elements) does not match the key's ", chunks->size(),
                         " chunks of ", ns.options.chunk_bytes, " bytes")));
  }
  auto [it, inserted] = cns.chunks.try_emplace({h.key, h.chunk});
  ChunkState& st = it->second;
  if (!inserted) {
    if (st.dtype != h.dtype || st.elements != elements) {
      return SendError(
          c, h,
          absl::InvalidArgumentError(absl::StrCat(
              "init of key ", h.key, " chunk ", h.chunk, " by worker ", c->worker, ": ", elements,
              " elements of ", std::string(collectives::DataTypeName(h.dtype)),
              ", but it was initialised with ", st.elements, " of ",
              std::string(collectives::DataTypeName(st.dtype)))));
    }
  } else {
    const int slots = OptimizerStateSlots(ns.options.optimizer.kind);
    const size_t f32 = elements * 4;
    const size_t wire = elements * esize;
    const size_t total = f32 * (2 + slots) + 2 * (kHeaderBytes + wire);
    if (!service_->Reserve(total)) {
      cns.chunks.erase(it);
      return SendError(c, h,
                       absl::ResourceExhaustedError(absl::StrCat(
                           "init of key ", h.key, " chunk ", h.chunk, " needs ", total,
                           " bytes: the service's memory budget (",
                           service_->options().memory_budget_bytes, " bytes) is spent")));
    }
    st.elements = elements;
    st.dtype = h.dtype;
    st.wire_bytes = wire;
    st.w = AllocAligned(f32);
    st.g = AllocAligned(f32);
    if (slots >= 1) st.m = AllocAligned(f32);
    if (slots >= 2) st.v = AllocAligned(f32);
    for (auto& o : st.out) o = AllocAligned(kHeaderBytes + wire);
    const uint8_t* values = f.payload.data() + kInitPrefixBytes;
    ConvertToF32(reinterpret_cast<float*>(st.w.get()), values, h.dtype, elements);
    std::memcpy(st.out[0].get() + kHeaderBytes, values, wire);
    FrameHeader vh;
    vh.type = FrameType::kValues;
    vh.dtype = h.dtype;
    vh.ns = ns.id;
    vh.nonce = ns.nonce;
    vh.key = h.key;
    vh.chunk = h.chunk;
    vh.payload_bytes = static_cast<uint32_t>(wire);
    EncodeHeader(vh, st.out[0].get());
    st.pushed.assign(ns.options.workers, 0);
    st.worker_conn.assign(ns.options.workers, nullptr);
  }
  ServerConn* owner = st.worker_conn[c->worker];
  if (owner != nullptr && owner != c && !owner->dead) {
    // Another live connection of this worker holds the chunk: letting this one take it would
    // send the worker's replies to whoever opened it.
    return SendError(
        c, h,
        absl::AlreadyExistsError(absl::StrCat(
            "init of key ", h.key, " chunk ", h.chunk, " by worker ", c->worker,
            " refused: the worker holds it on another live connection (from ", owner->peer,
            "); two jobs share the namespace and its nonce, or a worker "
            "started twice")));
  }
  st.worker_conn[c->worker] = c;
  FrameHeader ack = h;
  ack.type = FrameType::kInitAck;
  SendControl(c, ack, {});
}

void Core::HandlePush(ServerConn* c, CoreNamespace& cns, const FrameView& f) {
  const FrameHeader& h = f.header;
  const Namespace& ns = *c->ns;
  auto it = cns.chunks.find({h.key, h.chunk});
  if (it == cns.chunks.end()) {
    return SendError(c, h,
                     absl::NotFoundError(absl::StrCat(
                         "push of key ", h.key, " chunk ", h.chunk, " by worker ", c->worker,
                         ": unknown key (not initialised on server core ", index_, ")")));
  }
  ChunkState& st = it->second;
  const size_t esize = collectives::DataTypeSize(h.dtype);
  if (h.dtype != st.dtype || f.payload.size() / esize != st.elements) {
    return SendError(c, h,
                     absl::InvalidArgumentError(absl::StrCat(
                         "push of key ", h.key, " chunk ", h.chunk, " by worker ", c->worker, ": ",
                         f.payload.size() / esize, " elements of ",
                         std::string(collectives::DataTypeName(h.dtype)), ", expected ",
                         st.elements, " of ", std::string(collectives::DataTypeName(st.dtype)))));
  }
  if (st.worker_conn[c->worker] != c) {
    return SendError(c, h,
                     absl::FailedPreconditionError(absl::StrCat(
                         "push of key ", h.key, " chunk ", h.chunk, " by worker ", c->worker,
                         " on a connection the worker did not initialise it on")));
  }
  if (h.round != st.round) {
    return SendError(c, h,
                     absl::FailedPreconditionError(absl::StrCat(
                         "push of key ", h.key, " chunk ", h.chunk, " by worker ", c->worker,
                         " for round ", h.round, ", but the server is at round ", st.round)));
  }
  if (st.pushed[c->worker]) {
    return SendError(c, h,
                     absl::AlreadyExistsError(
                         absl::StrCat("push of key ", h.key, " chunk ", h.chunk, " by worker ",
                                      c->worker, ": this worker already pushed round ", h.round)));
  }
  for (size_t w = 0; w < cns.gone.size(); ++w) {
    if (!cns.gone[w].empty()) {
      return SendError(c, h,
                       absl::UnavailableError(absl::StrCat(
                           "round ", h.round, " of key ", h.key, " chunk ", h.chunk,
                           " cannot complete: worker ", w, " is gone (", cns.gone[w], ")")));
    }
  }
  Accumulate(reinterpret_cast<float*>(st.g.get()), f.payload.data(), h.dtype, st.elements,
             st.count == 0);
  st.pushed[c->worker] = 1;
  if (st.count++ == 0) {
    st.started = absl::Now();
    ++cns.active;
  }
  if (st.count == ns.options.workers) Complete(ns, cns, h.key, h.chunk, st);
}

void Core::Complete(const Namespace& ns, CoreNamespace& cns, uint64_t key, uint32_t chunk,
                    ChunkState& st) {
  const int next = 1 - st.read;
  const auto& opt = ns.options.optimizer;
  ApplyOptimizer(opt.kind, PrepareStep(opt, st.round + 1), reinterpret_cast<float*>(st.w.get()),
                 reinterpret_cast<const float*>(st.g.get()), reinterpret_cast<float*>(st.m.get()),
                 reinterpret_cast<float*>(st.v.get()), st.out[next].get() + kHeaderBytes, st.dtype,
                 st.elements, UseNonTemporal(ns.options.store_policy, st.elements * 4));
  FrameHeader vh;
  vh.type = FrameType::kValues;
  vh.dtype = st.dtype;
  vh.ns = ns.id;
  vh.nonce = ns.nonce;
  vh.key = key;
  vh.chunk = chunk;
  vh.payload_bytes = static_cast<uint32_t>(st.wire_bytes);
  vh.round = st.round + 1;
  EncodeHeader(vh, st.out[next].get());
  // Double buffering: workers may still be receiving the previous values from out[read]; the
  // next round cannot end before each of them has them (it needs their next gradients).
  st.read = next;
  st.round++;
  st.count = 0;
  std::fill(st.pushed.begin(), st.pushed.end(), 0);
  --cns.active;
  for (ServerConn* wc : st.worker_conn) {
    if (wc != nullptr) SendValues(wc, st);
  }
}

void Core::FailRound(CoreNamespace& cns, uint64_t key, uint32_t chunk, ChunkState& st,
                     const absl::Status& why) {
  FrameHeader h;
  h.key = key;
  h.chunk = chunk;
  h.round = st.round;
  h.dtype = st.dtype;
  for (size_t w = 0; w < st.pushed.size(); ++w) {
    if (st.pushed[w] && st.worker_conn[w] != nullptr) SendError(st.worker_conn[w], h, why);
  }
  st.count = 0;
  std::fill(st.pushed.begin(), st.pushed.end(), 0);
  --cns.active;
}

void Core::WorkerGone(ServerConn* c, const absl::Status& why) {
  if (c->dead) return;
  c->dead = true;
  if (c->ns == nullptr) return;
  CoreNamespace& cns = namespaces_[c->ns->id];
  // A connection that holds none of the worker's chunks while another of its connections lives
  // (a refused second client's, say) takes nothing with it.
  bool holds = false;
  for (const auto& [id, st] : cns.chunks) holds = holds || st.worker_conn[c->worker] == c;
  bool other_live = false;
  for (const auto& [key, conn] : cns.joined) {
    other_live = other_live || (key.first == c->worker && conn != c && !conn->dead);
  }
  if (!holds && other_live) return;
  const std::string reason =
      absl::StrCat("its connection from ", c->peer, " failed: ", why.message());
  cns.gone[c->worker] = reason;
  for (auto& [id, st] : cns.chunks) {
    if (st.count > 0 && !st.pushed[c->worker]) {
      FailRound(cns, id.first, id.second, st,
                absl::UnavailableError(absl::StrCat("round ", st.round, " of key ", id.first,
                                                    " chunk ", id.second, " failed: worker ",
                                                    c->worker, " is gone (", reason, ")")));
    }
  }
}

void Core::CheckTimeouts() {
  const absl::Time now = absl::Now();
  const absl::Duration timeout = service_->options().round_timeout;
  for (auto& [ns_id, cns] : namespaces_) {
    if (cns.active == 0) continue;
    for (auto& [id, st] : cns.chunks) {
      if (st.count == 0 || now - st.started < timeout) continue;
      std::vector<int> missing;
      for (size_t w = 0; w < st.pushed.size(); ++w) {
        if (!st.pushed[w]) missing.push_back(static_cast<int>(w));
      }
      FailRound(cns, id.first, id.second, st,
                absl::DeadlineExceededError(absl::StrCat(
                    "round ", st.round, " of key ", id.first, " chunk ", id.second,
                    " failed: no gradient from worker(s) ", absl::StrJoin(missing, ", "),
                    " within ", absl::FormatDuration(timeout))));
    }
  }
}

void Core::SendValues(ServerConn* c, const ChunkState& st) {
  if (c->dead) return;
  const transport::ConstBuffer b{st.out[st.read].get(), kHeaderBytes + st.wire_bytes};
  absl::Status s = c->conn->PostSend(b, 0);
  if (!s.ok()) WorkerGone(c, s);
}

void Core::SendControl(ServerConn* c, FrameHeader h, absl::Span<const uint8_t> payload) {
  if (c->dead) return;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> frame(kHeaderBytes + payload.size());
  EncodeHeader(h, frame.data());
  if (!payload.empty()) std::memcpy(frame.data() + kHeaderBytes, payload.data(), payload.size());
  const uint64_t id = next_send_id_++;
  auto& stored = control_sends_[id] = std::move(frame);
  absl::Status s = c->conn->PostSend({stored.data(), stored.size()}, id);
  if (!s.ok()) {
    control_sends_.erase(id);
    WorkerGone(c, s);
  }
}

void Core::SendError(ServerConn* c, const FrameHeader& about, const absl::Status& status) {
  FrameHeader h = about;
  h.type = FrameType::kError;
  h.code = static_cast<uint8_t>(status.code());
  h.dtype = IsWireType(about.dtype) ? about.dtype : DataType::kF32;
  std::string msg = absl::StrCat("server core ", index_, ": ", status.message());
  if (msg.size() > kMaxErrorBytes) msg.resize(kMaxErrorBytes);
  SendControl(c, h, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(msg.data()), msg.size()));
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<Service>> Service::Create(const ServiceOptions& options) {
  auto s = std::make_unique<internal::ServiceImpl>(options);
  PLEXUS_RETURN_IF_ERROR(s->Start());
  return std::unique_ptr<Service>(std::move(s));
}

}  // namespace plexus::aggregation
