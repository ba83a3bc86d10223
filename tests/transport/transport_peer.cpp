// A peer process for the conformance tests: connects to ADDRESS over BACKEND and streams
// messages until killed, so that the test can kill it mid-transfer.
//   transport_peer BACKEND ADDRESS stream
#include <cstdio>
#include <string>
#include <vector>

#include "plexus/transport/device.hpp"

namespace pt = plexus::transport;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: transport_peer BACKEND ADDRESS stream\n");
    return 2;
  }
  auto backend = pt::ParseBackend(argv[1]);
  if (!backend.ok()) return 2;
  pt::DeviceOptions options;
  options.backend = *backend;
  auto device = pt::Device::Create(options);
  if (!device.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", device.status().ToString().c_str());
    return 1;
  }
  auto cq = (*device)->CreateCompletionQueue();
  auto conn = (*device)->Connect(argv[2], cq.get());
  if (!conn.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", conn.status().ToString().c_str());
    return 1;
  }
  std::vector<char> data(64 << 20, 'x');
  for (uint64_t i = 0;; ++i) {  // until killed
    if (!(*conn)->PostSend(pt::ConstBuffer{data.data(), data.size()}, i).ok()) return 1;
    auto c = cq->Wait(absl::Seconds(60));
    if (!c.ok() || !c->status.ok()) return 1;
  }
}
