// A user's program: one message over an in-process connection pair.
#include <cstdio>
#include <string>

#include "plexus/transport/device.hpp"

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
  return std::string(in) == "hello" ? 0 : 1;
}
