// A user's program: one message over an in-process connection pair, a one-rank allreduce and a
// token dispatch plan: the transport, collectives and moe components of an installed Plexus.
#include <stdlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "plexus/transport/device.hpp"
#include "plexus/transport/memory.hpp"
#ifndef PLEXUS_CONSUMER_TRANSPORT_ONLY
#include "plexus/collectives/communicator.hpp"
#include "plexus/moe/dispatch.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"
#endif

namespace {

#ifdef PLEXUS_CONSUMER_TRANSPORT_ONLY
bool CollectivesAndMoe() { return true; }
#else

bool CollectivesAndMoe() {
  namespace pc = plexus::collectives;
  char dir[] = "/tmp/plexus-consumer-XXXXXX";
  if (mkdtemp(dir) == nullptr) return false;
  auto store = plexus::transport::FileStore::Open(dir);
  if (!store.ok()) return false;
  auto rendezvous = plexus::transport::Rendezvous::Create(0, 1, std::move(*store));
  if (!rendezvous.ok()) return false;
  pc::CommunicatorOptions options;
  options.device.backend = plexus::transport::Backend::kInproc;
  auto comm = pc::Communicator::Create(*rendezvous, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(comm.status().ToString()).c_str());
    return false;
  }
  std::vector<float> send = {1, 2, 3, 4}, recv(4);
  if (!(*comm)
           ->AllReduce(send.data(), recv.data(), 4, pc::DataType::kF32, pc::ReduceOp::kSum)
           .ok() ||
      recv != send) {
    return false;
  }
  comm->reset();
  std::string cleanup = std::string("rm -rf ") + dir;
  if (system(cleanup.c_str()) != 0) return false;

  plexus::moe::DispatchInput input;
  input.num_experts = 2;
  input.num_ranks = 1;
  input.tokens = {5, 7};
  input.replicas = {1, 1};
  auto plan = plexus::moe::ComputeDispatch(input);
  if (!plan.ok() || plan->local != std::vector<int64_t>{5, 7}) return false;
  std::printf(
      "consumer: one-rank allreduce and a dispatch plan through plexus::collectives, "
      "plexus::moe\n");
  return true;
}
#endif

}  // namespace

int main() {
  namespace pt = plexus::transport;
  pt::DeviceOptions options;
  options.backend = pt::Backend::kInproc;
  auto device = pt::Device::Create(options);
  if (!device.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(device.status().ToString()).c_str());
    return 1;
  }
  auto cq = (*device)->CreateCompletionQueue();
  auto listener = (*device)->Listen("");
  if (!listener.ok()) return 1;
  auto client = (*device)->Connect((*listener)->address(), cq.get());
  auto server = (*listener)->Accept(cq.get(), absl::Seconds(5));
  if (!client.ok() || !server.ok()) return 1;
  char in[6] = {};
  const char out[] = "hello";
  if (!(*server)->PostRecv({in, sizeof in}, 1).ok()) return 1;
  if (!(*client)->PostSend(pt::ConstBuffer{out, sizeof out}, 2).ok()) return 1;
  for (int i = 0; i < 2; ++i) {
    auto c = cq->Wait(absl::Seconds(5));
    if (!c.ok() || !c->status.ok()) return 1;
  }
  std::printf("consumer received '%s' over plexus::transport\n", in);
  if (std::string(in) != "hello") return 1;
  // The GPU path is probed at run time: a machine without a driver reports why, and runs on.
  std::string why;
  if (pt::CudaAvailable(&why)) {
    std::printf("consumer: CUDA available\n");
  } else {
    std::printf("consumer: CUDA unavailable: %s\n", why.c_str());
  }
  return CollectivesAndMoe() ? 0 : 1;
}
