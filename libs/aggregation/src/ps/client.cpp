// The worker side: connections to every server core, a progress thread that routes replies to
// the operations waiting for them, and the chunk -> connection mapping (LPT in Init order).
#include "plexus/aggregation/client.hpp"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "buffers.hpp"
#include "kernels.hpp"
#include "plexus/base/status.hpp"
#include "plexus/transport/device.hpp"
#include "wire.hpp"

namespace plexus::aggregation {

absl::Status Client::Push(uint64_t key, const void* grad, size_t elements) {
  PLEXUS_ASSIGN_OR_RETURN(Handle h, PushAsync(key, grad, elements));
  return Wait(h);
}
absl::Status Client::Pull(uint64_t key, void* out, size_t elements) {
  PLEXUS_ASSIGN_OR_RETURN(Handle h, PullAsync(key, out, elements));
  return Wait(h);
}
absl::Status Client::PushPull(uint64_t key, const void* grad, void* out, size_t elements) {
  PLEXUS_ASSIGN_OR_RETURN(Handle h, PushPullAsync(key, grad, out, elements));
  return Wait(h);
}

namespace internal {
namespace {

using transport::Completion;
using transport::Opcode;

constexpr int kRecvsPerConnection = 16;
constexpr uint64_t kHelloKey = ~uint64_t{0};

struct Op {
  int remaining = 0;
  int sends = 0;  // posted sends not yet completed: headers and frames must live until then
  absl::Status status;
  uint8_t* out = nullptr;  // values destination (null: none)
  uint64_t key = 0;
  std::vector<std::array<uint8_t, kHeaderBytes>> headers;  // alive until the sends complete
  std::vector<std::vector<uint8_t>> frames;                // init frames
  bool done() const { return remaining == 0; }
};

struct KeyState {
  DataType dtype = DataType::kF32;
  size_t elements = 0;
  std::vector<Chunk> chunks;
  std::vector<int> chunk_conn;
  uint64_t round = 0;          // rounds pushed
  std::vector<uint8_t> cache;  // values of the last completed push (pull elision)
  bool cache_valid = false;
  Client::Handle inflight_push = 0;
};

class ClientImpl : public Client {
 public:
  explicit ClientImpl(ClientOptions o) : o_(std::move(o)) {}
  ~ClientImpl() override {
    stop_ = true;
    if (progress_.joinable()) progress_.join();
    for (auto& c : conns_) c->Close();
  }

  absl::Status Start() {
    if (o_.addresses.empty()) return absl::InvalidArgumentError("ClientOptions.addresses is empty");
    const int nconn = o_.connections > 0 ? o_.connections : static_cast<int>(o_.addresses.size());
    transport::DeviceOptions dopts;
    dopts.backend = o_.backend;
    dopts.op_timeout = o_.op_timeout;
    dopts.tcp = o_.tcp;
    dopts.connect_timeout = o_.timeout;
    if (o_.backend == transport::Backend::kTcp) dopts.local_address = "127.0.0.1";
    PLEXUS_ASSIGN_OR_RETURN(device_, transport::Device::Create(dopts));
    cq_ = device_->CreateCompletionQueue();
    recv_bytes_ = kHeaderBytes + kMaxErrorBytes + o_.chunk_bytes;
    for (int q = 0; q < nconn; ++q) {
      const std::string& addr = o_.addresses[q % o_.addresses.size()];
      auto conn = device_->Connect(addr, cq_.get());
      if (!conn.ok()) {
        return base::Annotate(conn.status(),
                              absl::StrCat("worker ", o_.worker, ": connection ", q, " to ", addr));
      }
      conns_.push_back(*std::move(conn));
      peers_.push_back(addr);
      conn_ids_[conns_.back()->id()] = q;
      recv_.emplace_back();
      for (int i = 0; i < kRecvsPerConnection; ++i) {
        recv_[q].push_back(AllocAligned(recv_bytes_));
        PLEXUS_RETURN_IF_ERROR(
            conns_[q]->PostRecv({recv_[q][i].get(), recv_bytes_}, static_cast<uint64_t>(i)));
      }
    }
    conn_load_.assign(nconn, 0);
    progress_ = std::thread([this] { ProgressLoop(); });
    // Hello on every connection; the acks route by (kHelloKey, connection).
    Handle h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      h = NewOp(kHelloKey, nconn, nullptr);
      Op& op = ops_[h];
      op.headers.resize(nconn);
      for (int q = 0; q < nconn; ++q) {
        FrameHeader fh =
            Header(FrameType::kHello, kHelloKey, static_cast<uint32_t>(q), 0, DataType::kF32, 8);
        auto& frame = op.frames.emplace_back(kHeaderBytes + 8);
        EncodeHeader(fh, frame.data());
        const uint32_t idx = static_cast<uint32_t>(q), n = static_cast<uint32_t>(nconn);
        std::memcpy(frame.data() + kHeaderBytes, &idx, 4);
        std::memcpy(frame.data() + kHeaderBytes + 4, &n, 4);
        waiting_[{kHelloKey, static_cast<uint32_t>(q)}] = h;
        PLEXUS_RETURN_IF_ERROR(Send(q, h, {{frame.data(), frame.size()}}));
      }
    }
    return base::Annotate(Wait(h),
                          absl::StrCat("worker ", o_.worker, ": joining namespace ", o_.ns.id));
  }

  int worker() const override { return o_.worker; }

  absl::Status Init(uint64_t key, DataType dtype, const void* values, size_t elements) override {
    if (!IsWireType(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("Init of key ", key, ": dtype ",
                                                     std::string(collectives::DataTypeName(dtype)),
                                                     " is not f32, bf16 or f16"));
    }
    const size_t esize = collectives::DataTypeSize(dtype);
    PLEXUS_ASSIGN_OR_RETURN(auto chunks, SplitKey(key, elements, esize, o_.chunk_bytes));
    Handle h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PLEXUS_RETURN_IF_ERROR(broken_);
      if (keys_.contains(key)) {
        return absl::AlreadyExistsError(absl::StrCat("Init of key ", key, ": already initialised"));
      }
      std::vector<uint64_t> sizes(chunks.size());
      for (size_t i = 0; i < chunks.size(); ++i) sizes[i] = chunks[i].bytes;
      KeyState ks;
      ks.dtype = dtype;
      ks.elements = elements;
      ks.chunk_conn = LptAssign(sizes, static_cast<int>(conns_.size()), conn_load_);
      for (size_t i = 0; i < chunks.size(); ++i) conn_load_[ks.chunk_conn[i]] += sizes[i];
      ks.cache.resize(elements * esize);
      ks.chunks = chunks;
      h = NewOp(key, static_cast<int>(chunks.size()), nullptr);
      Op& op = ops_[h];
      for (size_t i = 0; i < chunks.size(); ++i) {
        const Chunk& c = chunks[i];
        auto& frame = op.frames.emplace_back(kHeaderBytes + kInitPrefixBytes + c.bytes);
        EncodeHeader(Header(FrameType::kInit, key, c.index, 0, dtype, kInitPrefixBytes + c.bytes),
                     frame.data());
        const uint64_t total = elements, offset = c.offset;
        std::memcpy(frame.data() + kHeaderBytes, &total, 8);
        std::memcpy(frame.data() + kHeaderBytes + 8, &offset, 8);
        std::memcpy(frame.data() + kHeaderBytes + kInitPrefixBytes,
                    static_cast<const uint8_t*>(values) + c.offset * esize, c.bytes);
        waiting_[{key, c.index}] = h;
        absl::Status s = Send(ks.chunk_conn[i], h, {{frame.data(), frame.size()}});
        if (!s.ok()) FinishChunk(h, s);
      }
      keys_[key] = std::move(ks);
    }
    return Wait(h);
  }

  absl::StatusOr<Handle> PushAsync(uint64_t key, const void* grad, size_t elements) override {
    std::lock_guard<std::mutex> lock(mu_);
    PLEXUS_ASSIGN_OR_RETURN(KeyState * ks, FindKey(key, elements, "Push"));
    return StartPush(key, *ks, grad, ks->cache.data());
  }

  absl::StatusOr<Handle> PushPullAsync(uint64_t key, const void* grad, void* out,
                                       size_t elements) override {
    std::lock_guard<std::mutex> lock(mu_);
    PLEXUS_ASSIGN_OR_RETURN(KeyState * ks, FindKey(key, elements, "PushPull"));
    return StartPush(key, *ks, grad, static_cast<uint8_t*>(out));
  }

  absl::StatusOr<Handle> PullAsync(uint64_t key, void* out, size_t elements) override {
    Handle pending = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PLEXUS_ASSIGN_OR_RETURN(KeyState * ks, FindKey(key, elements, "Pull"));
      pending = ks->inflight_push;
    }
    // The values of an unfinished push arrive without asking (pull elision): wait for them.
    if (pending != 0) PLEXUS_RETURN_IF_ERROR(Wait(pending));
    std::lock_guard<std::mutex> lock(mu_);
    KeyState& ks = keys_[key];
    if (ks.cache_valid) {
      std::memcpy(out, ks.cache.data(), ks.cache.size());
      const Handle h = NewOp(key, 0, nullptr);
      return h;
    }
    PLEXUS_RETURN_IF_ERROR(CheckIdle(key, ks, "Pull"));
    const Handle h = NewOp(key, static_cast<int>(ks.chunks.size()), static_cast<uint8_t*>(out));
    Op& op = ops_[h];
    op.headers.resize(ks.chunks.size());
    for (size_t i = 0; i < ks.chunks.size(); ++i) {
      EncodeHeader(Header(FrameType::kPull, key, ks.chunks[i].index, ks.round, ks.dtype, 0),
                   op.headers[i].data());
      waiting_[{key, ks.chunks[i].index}] = h;
      absl::Status s = Send(ks.chunk_conn[i], h, {{op.headers[i].data(), kHeaderBytes}});
      if (!s.ok()) FinishChunk(h, s);
    }
    return h;
  }

  absl::Status Wait(Handle h, absl::Duration timeout = absl::InfiniteDuration()) override {
    if (timeout == absl::InfiniteDuration()) timeout = o_.timeout;
    const absl::Time deadline = absl::Now() + timeout;
    std::unique_lock<std::mutex> lock(mu_);
    auto it = ops_.find(h);
    if (it == ops_.end()) {
      return absl::NotFoundError(absl::StrCat("handle ", h, " is unknown or was waited for"));
    }
    while (!it->second.done()) {
      if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
          !it->second.done()) {
        const uint64_t key = it->second.key;
        FailOp(h,
               absl::DeadlineExceededError(absl::StrCat(
                   "worker ", o_.worker, ": no reply for key ", key, " within ",
                   absl::FormatDuration(timeout), " (server ", absl::StrJoin(peers_, ","), ")")));
        break;
      }
      it = ops_.find(h);
    }
    absl::Status st = it->second.status;
    const uint64_t key = it->second.key;
    if (it->second.sends > 0) retired_[h] = std::move(it->second);  // freed as the sends complete
    ops_.erase(it);
    auto kit = keys_.find(key);
    if (kit != keys_.end() && kit->second.inflight_push == h) {
      kit->second.inflight_push = 0;
      kit->second.cache_valid = st.ok();
      if (st.ok()) kit->second.round++;
    }
    return st;
  }

 private:
  FrameHeader Header(FrameType type, uint64_t key, uint32_t chunk, uint64_t round, DataType dtype,
                     size_t payload) const {
    FrameHeader h;
    h.type = type;
    h.dtype = dtype;
    h.ns = o_.ns.id;
    h.nonce = o_.ns.nonce;
    h.worker = static_cast<uint32_t>(o_.worker);
    h.key = key;
    h.chunk = chunk;
    h.round = round;
    h.payload_bytes = static_cast<uint32_t>(payload);
    return h;
  }

  Handle NewOp(uint64_t key, int remaining, uint8_t* out) {
    const Handle h = next_handle_++;
    Op& op = ops_[h];
    op.key = key;
    op.remaining = remaining;
    op.out = out;
    return h;
  }

  absl::StatusOr<KeyState*> FindKey(uint64_t key, size_t elements, const char* what) {
    PLEXUS_RETURN_IF_ERROR(broken_);
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      return absl::NotFoundError(absl::StrCat(what, " of key ", key, ": not initialised (Init)"));
    }
    if (elements != it->second.elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of key ", key, ": ", elements,
                                                     " elements, but the key has ",
                                                     it->second.elements));
    }
    return &it->second;
  }

  absl::Status CheckIdle(uint64_t key, const KeyState& ks, const char* what) {
    for (const auto& c : ks.chunks) {
      if (waiting_.contains({key, c.index})) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " of key ", key, ": an operation on it is in flight; Wait for it first"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Handle> StartPush(uint64_t key, KeyState& ks, const void* grad, uint8_t* out) {
    PLEXUS_RETURN_IF_ERROR(CheckIdle(key, ks, "Push"));
    if (ks.inflight_push != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("Push of key ", key, ": the previous push was not waited for"));
    }
    const size_t esize = collectives::DataTypeSize(ks.dtype);
    const Handle h = NewOp(key, static_cast<int>(ks.chunks.size()), out);
    Op& op = ops_[h];
    op.headers.resize(ks.chunks.size());
    ks.inflight_push = h;
    ks.cache_valid = false;
    for (size_t i = 0; i < ks.chunks.size(); ++i) {
      const Chunk& c = ks.chunks[i];
      EncodeHeader(Header(FrameType::kPush, key, c.index, ks.round, ks.dtype, c.bytes),
                   op.headers[i].data());
      waiting_[{key, c.index}] = h;
      const transport::ConstBuffer parts[2] = {
          {op.headers[i].data(), kHeaderBytes},
          {static_cast<const uint8_t*>(grad) + c.offset * esize, c.bytes}};
      absl::Status s = Send(ks.chunk_conn[i], h, {parts[0], parts[1]});
      if (!s.ok()) FinishChunk(h, s);
    }
    return h;
  }

  // Posts one message on connection q for operation h (mu_ held); h's buffers outlive it.
  absl::Status Send(int q, Handle h, std::initializer_list<transport::ConstBuffer> parts) {
    absl::Status s = conns_[q]->PostSend(absl::MakeConstSpan(parts.begin(), parts.size()), h);
    if (s.ok()) ++ops_[h].sends;
    return s;
  }

  void SendDone(Handle h) {
    if (auto it = ops_.find(h); it != ops_.end()) {
      --it->second.sends;
    } else if (auto r = retired_.find(h); r != retired_.end() && --r->second.sends <= 0) {
      retired_.erase(r);
    }
  }

  void FinishChunk(Handle h, const absl::Status& s) {
    auto it = ops_.find(h);
    if (it == ops_.end()) return;
    if (!s.ok() && it->second.status.ok()) it->second.status = s;
    if (it->second.remaining > 0 && --it->second.remaining == 0) cv_.notify_all();
  }

  void FailOp(Handle h, const absl::Status& s) {
    auto it = ops_.find(h);
    if (it == ops_.end()) return;
    if (it->second.status.ok()) it->second.status = s;
    it->second.remaining = 0;
    for (auto w = waiting_.begin(); w != waiting_.end();) {
      if (w->second == h) {
        waiting_.erase(w++);
      } else {
        ++w;
      }
    }
    cv_.notify_all();
  }

  void ProgressLoop() {
    Completion batch[32];
    while (!stop_) {
      size_t n = cq_->Poll(absl::MakeSpan(batch));
      if (n == 0) {
        auto one = cq_->Wait(absl::Milliseconds(20));
        if (!one.ok()) continue;
        batch[0] = *std::move(one);
        n = 1;
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < n; ++i) Handle1(batch[i]);
    }
  }

  void Handle1(const Completion& c) {
    auto qit = conn_ids_.find(c.connection_id);
    if (qit == conn_ids_.end()) return;
    const int q = qit->second;
    if (c.opcode == Opcode::kSend) SendDone(c.wr_id);
    if (!c.status.ok()) {
      if (broken_.ok()) {
        broken_ = absl::UnavailableError(absl::StrCat("worker ", o_.worker, ": connection ", q,
                                                      " to server ", peers_[q],
                                                      " failed: ", c.status.message()));
        std::vector<Handle> all;
        for (auto& [h, op] : ops_) all.push_back(h);
        for (Handle h : all) FailOp(h, broken_);
      }
      return;
    }
    if (c.opcode != Opcode::kRecv) return;
    auto frame = DecodeFrame(absl::MakeConstSpan(recv_[q][c.wr_id].get(), c.bytes));
    if (frame.ok()) Route(q, *frame);
    absl::Status s = conns_[q]->PostRecv({recv_[q][c.wr_id].get(), recv_bytes_}, c.wr_id);
    (void)s;  // a failed connection reports itself through the queue
  }

  void Route(int q, const FrameView& f) {
    const FrameHeader& h = f.header;
    // Replies carry the (key, chunk) of the request; hello replies (kHelloKey, connection).
    auto w = waiting_.find({h.key, h.chunk});
    if (w == waiting_.end()) return;  // nothing waits: a late or unsolicited frame
    const Handle handle = w->second;
    auto it = ops_.find(handle);
    if (it == ops_.end()) return;
    Op& op = it->second;
    absl::Status status;
    if (h.type == FrameType::kError) {
      status = absl::Status(
          static_cast<absl::StatusCode>(h.code),
          std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
    } else if (h.type == FrameType::kValues) {
      auto kit = keys_.find(h.key);
      if (kit == keys_.end() || h.chunk >= kit->second.chunks.size()) return;
      const KeyState& ks = kit->second;
      const Chunk& ch = ks.chunks[h.chunk];
      if (h.dtype != ks.dtype || f.payload.size() != ch.bytes) {
        status = absl::DataLossError(absl::StrCat("values of key ", h.key, " chunk ", h.chunk,
                                                  " from server ", peers_[q], ": ",
                                                  f.payload.size(), " bytes, expected ", ch.bytes));
      } else if (op.out != nullptr) {
        const size_t esize = collectives::DataTypeSize(ks.dtype);
        std::memcpy(op.out + ch.offset * esize, f.payload.data(), ch.bytes);
        if (op.out != ks.cache.data()) {
          std::memcpy(keys_[h.key].cache.data() + ch.offset * esize, f.payload.data(), ch.bytes);
        }
      }
    } else if (h.type != FrameType::kHelloAck && h.type != FrameType::kInitAck) {
      return;
    }
    waiting_.erase(w);
    FinishChunk(handle, status);
  }

  ClientOptions o_;
  std::shared_ptr<transport::Device> device_;
  std::unique_ptr<transport::CompletionQueue> cq_;
  std::vector<std::vector<AlignedBytes>> recv_;  // outlives the connections that fill it
  std::vector<std::unique_ptr<transport::Connection>> conns_;
  std::vector<std::string> peers_;
  absl::flat_hash_map<uint64_t, int> conn_ids_;
  size_t recv_bytes_ = 0;
  std::thread progress_;
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  absl::Status broken_;
  std::vector<uint64_t> conn_load_;
  absl::flat_hash_map<uint64_t, KeyState> keys_;
  absl::flat_hash_map<Handle, Op> ops_;
  absl::flat_hash_map<Handle, Op> retired_;  // waited for, sends still in flight
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, Handle> waiting_;
  Handle next_handle_ = 1;
};

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto c = std::make_unique<internal::ClientImpl>(options);
  PLEXUS_RETURN_IF_ERROR(c->Start());
  return std::unique_ptr<Client>(std::move(c));
}

}  // namespace plexus::aggregation
