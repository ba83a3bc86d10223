// plexus-bench-collectives-gloo: one rank of the Gloo peer of plexus-bench-collectives (started
// by it; not meant to be run by hand): allreduce (ring, ring_chunked or halving_doubling),
// broadcast, allgather and alltoall. Gloo's tcp transport on 127.0.0.1; the ranks
// meet through Plexus's rendezvous (PLEXUS_RANK, PLEXUS_WORLD_SIZE, PLEXUS_STORE_ADDR), which
// Gloo sees as a gloo::rendezvous::Store.
//
//   plexus-bench-collectives-gloo [--algorithm ring|ring_chunked|halving_doubling] [--ops LIST]
//       [--sizes LIST] [--iters N] [--warmup N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gloo/allgather.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/alltoall.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "plexus/transport/rendezvous.hpp"

namespace {

namespace pb = plexus::bench;
namespace pt = plexus::transport;

constexpr auto kTimeout = std::chrono::seconds(120);

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "plexus-bench-collectives-gloo: %s\n", message.c_str());
  std::exit(1);
}

// Gloo's store interface over a Plexus store; Gloo reports failures by exception.
class PlexusStoreForGloo : public gloo::rendezvous::Store {
 public:
  explicit PlexusStoreForGloo(std::shared_ptr<pt::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const absl::Status s = store_->Set(key, std::string_view(data.data(), data.size()));
    if (!s.ok()) throw std::runtime_error("store set " + key + ": " + s.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->Get(key, absl::FromChrono(kTimeout));
    if (!value.ok())
      throw std::runtime_error("store get " + key + ": " + value.status().ToString());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kTimeout); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Status s = store_->Wait(keys, absl::FromChrono(timeout));
    if (!s.ok()) throw std::runtime_error("store wait: " + s.ToString());
  }

 private:
  std::shared_ptr<pt::Store> store_;
};

class GlooCollectives : public pb::CollectiveUnderTest {
 public:
  GlooCollectives(std::shared_ptr<gloo::Context> context, std::string algorithm)
      : context_(std::move(context)), algorithm_(std::move(algorithm)) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  // Gloo's reduce-scatter (halving-doubling, in place, ragged counts) and reduce are left out.
  bool Supports(pb::Op op) const override {
    return op != pb::Op::kReduceScatter && op != pb::Op::kReduce;
  }

  void Prepare(pb::OpBuffers& buffers) override {
    buffers_ = &buffers;
    op_ = buffers.op();
    float* send = buffers.send();
    float* recv = buffers.recv();
    const pb::OpShape& shape = buffers.shape();
    switch (op_) {
      case pb::Op::kAllreduce: {
        // In place on recv, which starts as a copy of the input.
        std::copy(send, send + shape.count, recv);
        const std::vector<float*> ptrs = {recv};
        const int n = static_cast<int>(shape.count);
        if (algorithm_ == "ring") {
          allreduce_ = std::make_unique<gloo::AllreduceRing<float>>(context_, ptrs, n);
        } else if (algorithm_ == "ring_chunked") {
          allreduce_ = std::make_unique<gloo::AllreduceRingChunked<float>>(context_, ptrs, n);
        } else {
          allreduce_ = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context_, ptrs, n);
        }
        break;
      }
      case pb::Op::kBroadcast:
      case pb::Op::kAllgather:
      case pb::Op::kAlltoall:
        break;  // options per call (Run)
      case pb::Op::kReduceScatter:
      case pb::Op::kReduce:
        Die(std::string(pb::OpName(op_)) + " is not measured for Gloo");
    }
  }
  // Gloo reduces in place, so the timed allreduce calls multiply the values by the world size
  // each time until they reach infinity; x86 adds infinities at full speed (only subnormals are
  // slow), and RunAndCheck starts again from the pattern.
  // Broadcast, allgather and alltoall build their options per call with a fresh tag, as
  // PyTorch's Gloo backend does. Over Gloo 0.x's tcp transport they take milliseconds per
  // message here (1 MiB broadcast, 2 ranks: ~0.7 s), which is why the driver runs them only
  // with --peers gloo.
  void Run() override {
    float* send = buffers_->send();
    float* recv = buffers_->recv();
    const pb::OpShape& shape = buffers_->shape();
    switch (op_) {
      case pb::Op::kAllreduce:
        allreduce_->run();
        break;
      case pb::Op::kBroadcast: {
        gloo::BroadcastOptions opts(context_);
        opts.setTag(NextTag());
        opts.setRoot(0);
        opts.setOutput(recv, shape.recv_count);
        gloo::broadcast(opts);
        break;
      }
      case pb::Op::kAllgather: {
        gloo::AllgatherOptions opts(context_);
        opts.setTag(NextTag());
        opts.setInput(send, shape.send_count);
        opts.setOutput(recv, shape.recv_count);
        gloo::allgather(opts);
        break;
      }
      case pb::Op::kAlltoall: {
        gloo::AlltoallOptions opts(context_);
        opts.setTag(NextTag());
        opts.setInput(send, shape.send_count);
        opts.setOutput(recv, shape.recv_count);
        gloo::alltoall(opts);
        break;
      }
      case pb::Op::kReduceScatter:
      case pb::Op::kReduce:
        break;
    }
  }
  size_t RunAndCheck(pb::OpBuffers& buffers) override {
    buffers.Refill();
    if (op_ == pb::Op::kAllreduce) {
      std::copy(buffers.send(), buffers.send() + buffers.shape().count, buffers.recv());
    }
    Run();
    return buffers.CountWrong();
  }
  void Barrier() override { gloo::BarrierAllToAll(context_).run(); }
  double Max(double value) override { return Reduce(value, gloo::ReductionFunction<double>::max); }
  double Sum(double value) override { return Reduce(value, gloo::ReductionFunction<double>::sum); }

 private:
  double Reduce(double value, const gloo::ReductionFunction<double>* fn) {
    std::vector<double*> ptrs = {&value};
    gloo::AllreduceRing<double>(context_, ptrs, 1, fn).run();
    return value;
  }

  std::shared_ptr<gloo::Context> context_;
  std::string algorithm_;
  pb::OpBuffers* buffers_ = nullptr;
  pb::Op op_ = pb::Op::kAllreduce;
  std::unique_ptr<gloo::Algorithm> allreduce_;
  uint32_t tag_ = 0;

  uint32_t NextTag() { return tag_++; }
};

}  // namespace

int main(int argc, char** argv) {
  pb::WorkerOptions options = pb::ParseWorkerOptions(argc, argv, "plexus-bench-collectives-gloo");
  const bool allreduce =
      std::find(options.ops.begin(), options.ops.end(), pb::Op::kAllreduce) != options.ops.end();
  if (allreduce && options.algorithm != "ring" && options.algorithm != "ring_chunked" &&
      options.algorithm != "halving_doubling") {
    Die("--algorithm must be ring, ring_chunked or halving_doubling, got '" + options.algorithm +
        "'");
  }
  options.transport = "tcp";
  auto rendezvous = pt::Rendezvous::FromEnv(absl::Minutes(2));
  if (!rendezvous.ok()) Die("rendezvous: " + rendezvous.status().ToString());
  try {
    PlexusStoreForGloo store(rendezvous->store());
    gloo::rendezvous::PrefixStore prefixed("gloo", store);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context =
        std::make_shared<gloo::rendezvous::Context>(rendezvous->rank(), rendezvous->world_size());
    context->setTimeout(kTimeout);
    context->connectFullMesh(prefixed, device);
    GlooCollectives impl(context, options.algorithm);
    // Allreduce under its algorithm's name; Gloo has one implementation of the others.
    pb::MeasureOps(impl, options, [&](pb::Op op) {
      return op == pb::Op::kAllreduce ? "gloo_" + options.algorithm : std::string("gloo");
    });
    // No rank closes its Gloo connections before every rank is past its last Gloo operation:
    // a slower rank still inside one saw "Connection closed by peer" when a faster one exited.
    if (absl::Status s = rendezvous->Barrier("gloo-done", absl::FromChrono(kTimeout)); !s.ok()) {
      Die("final barrier: " + s.ToString());
    }
  } catch (const std::exception& e) {
    Die(std::string("gloo: ") + e.what());
  }
  return 0;
}
