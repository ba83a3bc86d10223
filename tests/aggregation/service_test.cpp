// The parameter server end to end, workers as threads over tcp and shm on this host: exact
// values after each round, bf16 gradients, pull elision, namespaces and nonces, malformed and
// hostile frames (refused, nothing changes), a worker that dies or stays silent (the round fails
// naming it within the timeout), and the memory budget.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "plexus/aggregation/client.hpp"
#include "plexus/aggregation/service.hpp"
#include "plexus/kernels/reduce.hpp"
#include "plexus/transport/device.hpp"
#include "ps/kernels.hpp"
#include "ps/wire.hpp"

namespace pa = plexus::aggregation;
namespace pai = plexus::aggregation::internal;
namespace pt = plexus::transport;
using plexus::collectives::DataType;

namespace {

struct Job {
  std::unique_ptr<pa::Service> service;
  pa::NamespaceInfo ns;
  std::vector<std::unique_ptr<pa::Client>> clients;
  pt::Backend backend;
  size_t chunk_bytes;
};

pa::ClientOptions ClientOpts(const Job& job, int worker) {
  pa::ClientOptions o;
  o.backend = job.backend;
  o.addresses = job.service->addresses();
  o.ns = job.ns;
  o.worker = worker;
  o.chunk_bytes = job.chunk_bytes;
  o.timeout = absl::Seconds(20);
  return o;
}

Job MakeJob(pt::Backend backend, int workers, int cores, pa::UpdateRule opt,
            size_t chunk_bytes = 1024, absl::Duration round_timeout = absl::Seconds(20),
            size_t budget = size_t{1} << 30, int connect = -1) {
  Job job;
  job.backend = backend;
  job.chunk_bytes = chunk_bytes;
  pa::ServiceOptions so;
  so.backend = backend;
  so.cores = cores;
  so.round_timeout = round_timeout;
  so.memory_budget_bytes = budget;
  so.op_timeout = absl::Seconds(10);
  job.service = pa::Service::Create(so).value();
  pa::NamespaceOptions no;
  no.name = "test";
  no.workers = workers;
  no.optimizer = opt;
  no.chunk_bytes = chunk_bytes;
  job.ns = job.service->CreateNamespace(no).value();
  for (int w = 0; w < (connect < 0 ? workers : connect); ++w) {
    auto c = pa::Client::Connect(ClientOpts(job, w));
    REQUIRE(c.ok());
    job.clients.push_back(*std::move(c));
  }
  return job;
}

// Runs f(worker) on every worker at once.
template <typename F>
void OnAll(Job& job, F f) {
  std::vector<std::thread> threads;
  for (size_t w = 0; w < job.clients.size(); ++w)
    threads.emplace_back([&, w] { f(static_cast<int>(w)); });
  for (auto& t : threads) t.join();
}

// OnAll of f(worker) -> absl::Status, then requires every worker's status to be ok: here, after
// the join, since Catch2 assertions are not thread-safe.
template <typename F>
void RequireOkOnAll(Job& job, F f) {
  std::vector<absl::Status> st(job.clients.size());
  OnAll(job, [&](int w) { st[w] = f(w); });
  for (size_t w = 0; w < st.size(); ++w) {
    INFO("worker " << w << ": " << st[w]);
    REQUIRE(st[w].ok());
  }
}

std::vector<float> Grad(int worker, size_t n, int round) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i)
    g[i] = static_cast<float>((worker + 1) * (i % 17) + round) * 0.125f;
  return g;
}

pt::Backend BackendParam() { return GENERATE(pt::Backend::kTcp, pt::Backend::kShm); }

}  // namespace

TEST_CASE("PushPull sums every worker's gradient and runs the optimizer once per round",
          "[aggregation][service]") {
  const pt::Backend backend = BackendParam();
  pa::UpdateRule opt;
  opt.kind = pa::OptimizerKind::kNesterov;
  opt.learning_rate = 0.5f;
  opt.rescale = 1.0f / 3;
  Job job = MakeJob(backend, 3, 2, opt);
  const size_t n = 1000;  // 4 chunks of 256 floats over 2 cores
  std::vector<float> init(n);
  for (size_t i = 0; i < n; ++i) init[i] = static_cast<float>(i) * 0.01f;
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->Init(7, DataType::kF32, init.data(), n); });

  // The reference: the same kernels, one element array, the summed gradients.
  std::vector<float> ref_w = init, ref_m(n, 0.0f);
  std::vector<std::vector<float>> got(3, std::vector<float>(n));
  for (int round = 0; round < 3; ++round) {
    RequireOkOnAll(job, [&](int w) {
      auto g = Grad(w, n, round);
      return job.clients[w]->PushPull(7, g.data(), got[w].data(), n);
    });
    std::vector<float> sum = Grad(0, n, round);
    for (int w = 1; w < 3; ++w) {
      auto g = Grad(w, n, round);
      for (size_t i = 0; i < n; ++i) sum[i] += g[i];
    }
    pai::ApplyOptimizer(opt.kind, pai::PrepareStep(opt, round + 1), ref_w.data(), sum.data(),
                        ref_m.data(), nullptr, nullptr, DataType::kF32, n, false);
    for (int w = 0; w < 3; ++w) REQUIRE(std::memcmp(got[w].data(), ref_w.data(), n * 4) == 0);
  }
  // Pull after a push: the pushed round's values, with no request (pull elision).
  std::vector<float> pulled(n);
  REQUIRE(job.clients[1]->Pull(7, pulled.data(), n).ok());
  CHECK(std::memcmp(pulled.data(), ref_w.data(), n * 4) == 0);
  // A restarted worker pulls the current values from the server: worker 2 leaves and joins
  // again (refused with AlreadyExists until the server has seen its old connections close).
  job.clients[2].reset();
  absl::StatusOr<std::unique_ptr<pa::Client>> rejoined;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    rejoined = pa::Client::Connect(ClientOpts(job, 2));
  } while (absl::IsAlreadyExists(rejoined.status()) && absl::Now() < until);
  REQUIRE(rejoined.ok());
  auto late = *std::move(rejoined);
  REQUIRE(late->Init(7, DataType::kF32, init.data(), n).ok());
  std::fill(pulled.begin(), pulled.end(), 0.0f);
  REQUIRE(late->Pull(7, pulled.data(), n).ok());
  CHECK(std::memcmp(pulled.data(), ref_w.data(), n * 4) == 0);
}

TEST_CASE("bf16 and f16 gradients are summed in f32 against f32 master weights",
          "[aggregation][service]") {
  const DataType dtype = GENERATE(DataType::kBF16, DataType::kF16);
  INFO("dtype " << static_cast<int>(dtype));
  pa::UpdateRule opt;
  opt.kind = pa::OptimizerKind::kAdam;
  opt.learning_rate = 0.01f;
  Job job = MakeJob(pt::Backend::kTcp, 2, 1, opt, 512);
  const size_t n = 700;
  std::vector<uint16_t> init(n), g0(n), g1(n), out0(n), out1(n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = 1.0f + static_cast<float>(i) / 64;
  pai::ConvertFromF32(init.data(), dtype, f.data(), n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(i % 5) - 2.0f;
  pai::ConvertFromF32(g0.data(), dtype, f.data(), n);
  for (size_t i = 0; i < n; ++i) f[i] = 0.5f * static_cast<float>(i % 3);
  pai::ConvertFromF32(g1.data(), dtype, f.data(), n);
  RequireOkOnAll(job, [&](int w) { return job.clients[w]->Init(1, dtype, init.data(), n); });
  RequireOkOnAll(job, [&](int w) {
    return job.clients[w]->PushPull(1, w == 0 ? g0.data() : g1.data(),
                                    w == 0 ? out0.data() : out1.data(), n);
  });
  std::vector<float> w(n), sum(n), m(n, 0.0f), v(n, 0.0f);
  pai::ConvertToF32(w.data(), init.data(), dtype, n);
  pai::Accumulate(sum.data(), g0.data(), dtype, n, true);
  pai::Accumulate(sum.data(), g1.data(), dtype, n, false);
  std::vector<uint16_t> want(n);
  pai::ApplyOptimizer(opt.kind, pai::PrepareStep(opt, 1), w.data(), sum.data(), m.data(), v.data(),
                      want.data(), dtype, n, false);
  CHECK(out0 == want);
  CHECK(out1 == want);
}

TEST_CASE("A worker with another namespace's nonce cannot join", "[aggregation][service]") {
  Job job = MakeJob(pt::Backend::kTcp, 1, 1, {});
  pa::NamespaceOptions other;
  other.name = "other";
  other.chunk_bytes = (size_t{256} << 10) + 1;  // beyond ServiceOptions::max_chunk_bytes
  auto too_big = job.service->CreateNamespace(other);
  CHECK(too_big.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(too_big.status().message()).find("max_chunk_bytes") != std::string::npos);
  other.chunk_bytes = pa::kDefaultChunkBytes;
  auto ns2 = job.service->CreateNamespace(other).value();
  CHECK(ns2.id != job.ns.id);
  auto o = ClientOpts(job, 0);
  o.ns.nonce ^= 1;
  o.timeout = absl::Seconds(5);
  auto bad = pa::Client::Connect(o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kPermissionDenied);
  o.ns = {ns2.id, job.ns.nonce};  // a real namespace id with the wrong job's nonce
  CHECK(pa::Client::Connect(o).status().code() == absl::StatusCode::kPermissionDenied);
  o.ns = job.ns;
  o.worker = 5;  // outside the namespace's workers
  CHECK(pa::Client::Connect(o).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Two jobs share a service: the same key in two namespaces stays apart",
          "[aggregation][service]") {
  pa::UpdateRule sgd1;  // job 1: 2 workers, w -= 1.0 * sum
  sgd1.learning_rate = 1.0f;
  Job job = MakeJob(pt::Backend::kTcp, 2, 2, sgd1);
  pa::NamespaceOptions other;  // job 2: 1 worker, w -= 0.5 * g, its own key 0
  other.name = "job2";
  other.workers = 1;
  other.optimizer.learning_rate = 0.5f;
  other.chunk_bytes = job.chunk_bytes;
  const pa::NamespaceInfo ns2 = job.service->CreateNamespace(other).value();
  REQUIRE(ns2.nonce != job.ns.nonce);
  pa::ClientOptions o2 = ClientOpts(job, 0);
  o2.ns = ns2;
  auto job2 = pa::Client::Connect(o2).value();

  const size_t n = 600;  // 3 chunks of 256 floats
  std::vector<float> init1(n), init2(n);
  for (size_t i = 0; i < n; ++i) {
    init1[i] = static_cast<float>(i) * 0.5f;
    init2[i] = 1000.0f + static_cast<float>(i);
  }
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->Init(0, DataType::kF32, init1.data(), n); });
  REQUIRE(job2->Init(0, DataType::kF32, init2.data(), n).ok());
  // Job 2's single worker finishes its rounds while job 1's round waits for its second worker:
  // rounds are counted per namespace.
  const std::vector<float> g1(n, 1.0f), g2(n, 2.0f);
  std::vector<float> out2(n);
  for (int round = 1; round <= 2; ++round) {
    REQUIRE(job2->PushPull(0, g2.data(), out2.data(), n).ok());
    for (size_t i = 0; i < n; ++i) REQUIRE(out2[i] == init2[i] - 1.0f * static_cast<float>(round));
  }
  std::vector<std::vector<float>> out1(2, std::vector<float>(n));
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->PushPull(0, g1.data(), out1[w].data(), n); });
  for (int w = 0; w < 2; ++w) {
    for (size_t i = 0; i < n; ++i) REQUIRE(out1[w][i] == init1[i] - 2.0f);
  }
  // Neither job's values moved the other's: a pull of job 2 still reads its own.
  std::fill(out2.begin(), out2.end(), 0.0f);
  REQUIRE(job2->Pull(0, out2.data(), n).ok());
  for (size_t i = 0; i < n; ++i) REQUIRE(out2[i] == init2[i] - 2.0f);
}

namespace {

// The hello of `worker` in the job's namespace, and its payload naming the connection index.
pai::FrameHeader HelloFrame(const Job& job, uint32_t worker) {
  pai::FrameHeader h;
  h.type = pai::FrameType::kHello;
  h.ns = job.ns.id;
  h.nonce = job.ns.nonce;
  h.worker = worker;
  return h;
}
std::vector<uint8_t> HelloPayload(uint8_t connection) {
  std::vector<uint8_t> payload(8, 0);
  payload[0] = connection;
  return payload;
}

// A hand-driven worker connection, to send frames the Client never would.
class RawWorker {
 public:
  RawWorker(const Job& job, int core) {
    pt::DeviceOptions d;
    d.backend = job.backend;
    d.local_address = "127.0.0.1";
    device_ = pt::Device::Create(d).value();
    cq_ = device_->CreateCompletionQueue();
    conn_ = device_->Connect(job.service->addresses()[core], cq_.get()).value();
  }
  // Sends a frame and returns the reply (decoded header, payload as text).
  std::pair<pai::FrameHeader, std::string> Exchange(pai::FrameHeader h,
                                                    const std::vector<uint8_t>& payload) {
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    std::vector<uint8_t> frame(pai::kHeaderBytes + payload.size());
    pai::EncodeHeader(h, frame.data());
    std::memcpy(frame.data() + pai::kHeaderBytes, payload.data(), payload.size());
    return ExchangeBytes(frame);
  }
  // Sends the frame twice and returns the one reply (the first send waits for other workers).
  std::pair<pai::FrameHeader, std::string> ExchangeTwice(pai::FrameHeader h,
                                                         const std::vector<uint8_t>& payload) {
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    first_.assign(pai::kHeaderBytes + payload.size(), 0);
    pai::EncodeHeader(h, first_.data());
    std::memcpy(first_.data() + pai::kHeaderBytes, payload.data(), payload.size());
    REQUIRE(conn_->PostSend({first_.data(), first_.size()}, 3).ok());
    auto c = cq_->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->opcode == pt::Opcode::kSend);
    return ExchangeBytes(first_);
  }
  std::pair<pai::FrameHeader, std::string> ExchangeBytes(const std::vector<uint8_t>& frame) {
    std::vector<uint8_t> reply(1 << 16);
    REQUIRE(conn_->PostRecv({reply.data(), reply.size()}, 1).ok());
    REQUIRE(conn_->PostSend({frame.data(), frame.size()}, 2).ok());
    size_t got = 0;
    for (int i = 0; i < 2; ++i) {
      auto c = cq_->Wait(absl::Seconds(10));
      REQUIRE(c.ok());
      REQUIRE(c->status.ok());
      if (c->opcode == pt::Opcode::kRecv) got = c->bytes;
    }
    if (got == 0) {  // the send completed first
      auto c = cq_->Wait(absl::Seconds(10));
      REQUIRE(c.ok());
      got = c->bytes;
    }
    auto f = pai::DecodeFrame(absl::MakeConstSpan(reply.data(), got)).value();
    return {f.header, std::string(f.payload.begin(), f.payload.end())};
  }

 private:
  std::shared_ptr<pt::Device> device_;
  std::unique_ptr<pt::CompletionQueue> cq_;
  std::unique_ptr<pt::Connection> conn_;
  std::vector<uint8_t> first_;
};

}  // namespace

TEST_CASE("Malformed pushes are refused with an error and change nothing",
          "[aggregation][service]") {
  pa::UpdateRule opt;  // SGD, lr 0.1
  Job job = MakeJob(pt::Backend::kTcp, 2, 1, opt, 1024);
  const size_t n = 256;  // one chunk
  std::vector<float> init(n, 1.0f);
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->Init(3, DataType::kF32, init.data(), n); });

  RawWorker raw(job, 0);
  const pai::FrameHeader hello = HelloFrame(job, 1);
  // Worker 1's connection 7 (its client uses connection 0 only): another connection of a live
  // worker, as a client with more connections than cores opens.
  auto [ack, ack_text] = raw.Exchange(hello, HelloPayload(7));
  REQUIRE(ack.type == pai::FrameType::kHelloAck);

  pai::FrameHeader push = hello;
  push.type = pai::FrameType::kPush;
  push.key = 3;
  std::vector<uint8_t> grad(n * 4, 0);
  const float big = 1000.0f;
  for (size_t i = 0; i < n; ++i) std::memcpy(grad.data() + 4 * i, &big, 4);

  SECTION("wrong length") {
    auto [h, text] = raw.Exchange(push, std::vector<uint8_t>(grad.begin(), grad.end() - 4));
    CHECK(h.type == pai::FrameType::kError);
    CHECK(h.code == static_cast<uint8_t>(absl::StatusCode::kInvalidArgument));
    CHECK(text.find("255 elements") != std::string::npos);
  }
  SECTION("unknown key") {
    push.key = 99;
    auto [h, text] = raw.Exchange(push, grad);
    CHECK(h.code == static_cast<uint8_t>(absl::StatusCode::kNotFound));
    CHECK(text.find("key 99") != std::string::npos);
  }
  SECTION("wrong nonce") {
    push.nonce ^= 0x5555;
    auto [h, text] = raw.Exchange(push, grad);
    CHECK(h.code == static_cast<uint8_t>(absl::StatusCode::kPermissionDenied));
  }
  SECTION("wrong namespace") {
    push.ns += 1;
    auto [h, text] = raw.Exchange(push, grad);
    CHECK(h.code == static_cast<uint8_t>(absl::StatusCode::kPermissionDenied));
  }
  SECTION("a chunk on a connection it was not initialised on") {
    auto [h, text] = raw.Exchange(push, grad);
    CHECK(h.code == static_cast<uint8_t>(absl::StatusCode::kFailedPrecondition));
  }
  SECTION("garbage bytes") {
    std::vector<uint8_t> junk(100, 0xAB);
    auto [h, text] = raw.ExchangeBytes(junk);
    CHECK(h.type == pai::FrameType::kError);
    CHECK(text.find("magic") != std::string::npos);
  }
  // Nothing changed: a normal round gives exactly init - lr * (g0 + g1).
  std::vector<std::vector<float>> out(2, std::vector<float>(n));
  RequireOkOnAll(job, [&](int w) {
    std::vector<float> g(n, static_cast<float>(w + 1));
    return job.clients[w]->PushPull(3, g.data(), out[w].data(), n);
  });
  for (size_t i = 0; i < n; ++i) REQUIRE(out[1][i] == 1.0f - 0.1f * 3.0f);
}

TEST_CASE("A worker that dies fails the round with an error naming it", "[aggregation][service]") {
  const pt::Backend backend = BackendParam();
  Job job = MakeJob(backend, 3, 1, {}, 1024, absl::Seconds(30));
  const size_t n = 100;
  std::vector<float> init(n, 0.0f);
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->Init(1, DataType::kF32, init.data(), n); });
  job.clients[2].reset();  // worker 2 goes away (its connections close)
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st(2);
  std::vector<std::thread> t;
  for (int w = 0; w < 2; ++w) {
    t.emplace_back([&, w] {
      std::vector<float> g(n, 1.0f), out(n);
      st[w] = job.clients[w]->PushPull(1, g.data(), out.data(), n);
    });
  }
  for (auto& th : t) th.join();
  for (int w = 0; w < 2; ++w) {
    INFO(st[w]);
    CHECK(st[w].code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(st[w].message()).find("worker 2") != std::string::npos);
  }
  CHECK(absl::Now() - start < absl::Seconds(10));  // long before the 30 s round timeout
}

TEST_CASE("A second client for a connected worker is refused and takes over nothing",
          "[aggregation][service]") {
  const pt::Backend backend = BackendParam();
  Job job = MakeJob(backend, 3, 1, {}, 1024, absl::Seconds(5));
  const size_t n = 100;
  std::vector<float> init(n, 0.0f);
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->Init(1, DataType::kF32, init.data(), n); });
  // Another job with the same namespace and nonce starts worker 1 again.
  pa::ClientOptions again = ClientOpts(job, 1);
  again.timeout = absl::Seconds(5);
  auto second = pa::Client::Connect(again);
  REQUIRE(!second.ok());
  INFO(second.status());
  CHECK(second.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(second.status().message()).find("worker 1") != std::string::npos);
  CHECK(std::string(second.status().message()).find("already connected") != std::string::npos);
  // Nor can another connection of worker 1 take over a chunk it holds: its init is refused.
  {
    RawWorker raw(job, 0);
    pai::FrameHeader h = HelloFrame(job, 1);
    REQUIRE(raw.Exchange(h, HelloPayload(9)).first.type == pai::FrameType::kHelloAck);
    h.type = pai::FrameType::kInit;
    h.key = 1;
    std::vector<uint8_t> init_payload(pai::kInitPrefixBytes + n * 4);
    const uint64_t total = n;
    std::memcpy(init_payload.data(), &total, 8);
    auto [reply, text] = raw.Exchange(h, init_payload);
    CHECK(reply.code == static_cast<uint8_t>(absl::StatusCode::kAlreadyExists));
    CHECK(text.find("another live connection") != std::string::npos);
  }
  // The job goes on: a round sums every worker's gradient, replies reach the right clients.
  std::vector<std::vector<float>> out(3, std::vector<float>(n));
  std::vector<absl::Status> st(3);
  OnAll(job, [&](int w) {
    std::vector<float> g(n, static_cast<float>(w + 1));
    st[w] = job.clients[w]->PushPull(1, g.data(), out[w].data(), n);
  });
  for (int w = 0; w < 3; ++w) {
    INFO("worker " << w << ": " << st[w]);
    REQUIRE(st[w].ok());
    CHECK(out[w][0] == out[0][0]);
  }
  CHECK(out[0][0] != 0.0f);  // the update ran (the default rule applies the summed gradient)
}

TEST_CASE("A silent worker fails the round within the round timeout", "[aggregation][service]") {
  const absl::Duration timeout = absl::Seconds(1);
  Job job = MakeJob(pt::Backend::kTcp, 3, 2, {}, 1024, timeout);
  const size_t n = 600;
  std::vector<float> init(n, 0.0f);
  RequireOkOnAll(job,
                 [&](int w) { return job.clients[w]->Init(1, DataType::kF32, init.data(), n); });
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st(2);
  std::vector<std::thread> t;
  for (int w = 0; w < 2; ++w) {  // worker 2 never pushes
    t.emplace_back([&, w] {
      std::vector<float> g(n, 1.0f), out(n);
      st[w] = job.clients[w]->PushPull(1, g.data(), out.data(), n);
    });
  }
  for (auto& th : t) th.join();
  const absl::Duration took = absl::Now() - start;
  for (int w = 0; w < 2; ++w) {
    INFO(st[w]);
    CHECK(st[w].code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(st[w].message()).find("worker(s) 2") != std::string::npos);
  }
  CHECK(took >= timeout);
  CHECK(took <= timeout * 1.25 + absl::Milliseconds(500));
}

TEST_CASE("Init beyond the memory budget is refused", "[aggregation][service]") {
  // One 256-float SGD chunk costs 2 * 1024 (w, merge) + 2 * (48 + 1024) (send buffers).
  Job job = MakeJob(pt::Backend::kTcp, 1, 1, {}, 1024, absl::Seconds(20), 5000);
  std::vector<float> v(512, 0.0f);
  REQUIRE(job.clients[0]->Init(1, DataType::kF32, v.data(), 256).ok());
  CHECK(job.service->memory_used() == 2 * 1024 + 2 * (48 + 1024));
  const absl::Status st = job.clients[0]->Init(2, DataType::kF32, v.data(), 256);
  CHECK(st.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(st.message()).find("memory budget") != std::string::npos);
}

TEST_CASE("Duplicate and out-of-round pushes are refused and change nothing",
          "[aggregation][service]") {
  pa::UpdateRule opt;  // SGD, lr 0.1
  // Worker 0 is a Client; worker 1 a raw connection that initialises the chunk itself.
  Job job = MakeJob(pt::Backend::kTcp, 2, 1, opt, 1024, absl::Seconds(20), size_t{1} << 30, 1);
  const size_t n = 64;
  std::vector<float> init(n, 2.0f);
  REQUIRE(job.clients[0]->Init(5, DataType::kF32, init.data(), n).ok());
  RawWorker raw(job, 0);
  pai::FrameHeader h = HelloFrame(job, 1);
  REQUIRE(raw.Exchange(h, HelloPayload(0)).first.type == pai::FrameType::kHelloAck);
  h.type = pai::FrameType::kInit;
  h.key = 5;
  std::vector<uint8_t> init_payload(pai::kInitPrefixBytes + n * 4);
  const uint64_t total = n;
  std::memcpy(init_payload.data(), &total, 8);
  std::memcpy(init_payload.data() + pai::kInitPrefixBytes, init.data(), n * 4);
  REQUIRE(raw.Exchange(h, init_payload).first.type == pai::FrameType::kInitAck);

  // Round 5 while the server is at round 0: refused.
  h.type = pai::FrameType::kPush;
  h.round = 5;
  std::vector<float> g1(n, 3.0f);
  std::vector<uint8_t> grad(n * 4);
  std::memcpy(grad.data(), g1.data(), n * 4);
  auto [ahead, ahead_text] = raw.Exchange(h, grad);
  CHECK(ahead.code == static_cast<uint8_t>(absl::StatusCode::kFailedPrecondition));
  CHECK(ahead_text.find("round 5") != std::string::npos);
  // Worker 0 pushes round 0 (async); the round cannot end without worker 1.
  std::vector<float> g0(n, 1.0f), out(n);
  auto handle = job.clients[0]->PushPullAsync(5, g0.data(), out.data(), n);
  REQUIRE(handle.ok());
  // Worker 1 pushes round 0 twice: the first completes the round; the second is refused (the
  // server is at round 1 now: a stale round) and changes nothing.
  h.round = 0;
  auto [values, values_text] = raw.Exchange(h, grad);
  CHECK(values.type == pai::FrameType::kValues);
  CHECK(values.round == 1);
  auto [stale, stale_text] = raw.Exchange(h, grad);
  CHECK(stale.code == static_cast<uint8_t>(absl::StatusCode::kFailedPrecondition));
  REQUIRE(job.clients[0]->Wait(*handle).ok());
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == 2.0f - 0.1f * 4.0f);
  // A second push of round 1 by worker 1 before the round ends: AlreadyExists.
  h.round = 1;
  // (The first push of round 1 gets no reply until worker 0 pushes.)
  auto [dup, dup_text] = raw.ExchangeTwice(h, grad);
  CHECK(dup.code == static_cast<uint8_t>(absl::StatusCode::kAlreadyExists));
  CHECK(dup_text.find("already pushed round 1") != std::string::npos);
  // Worker 0's round-1 push completes the round with worker 1's single contribution.
  std::vector<float> out2(n);
  REQUIRE(job.clients[0]->PushPull(5, g0.data(), out2.data(), n).ok());
  for (size_t i = 0; i < n; ++i) REQUIRE(out2[i] == out[i] - 0.1f * 4.0f);
}
