// A parameter-server worker process for process_test.cpp: joins the namespace, initialises one
// key, prints "ready" and waits to be killed.
//   aggregation_ps_worker TRANSPORT ADDRESSES NS NONCE RANK ELEMENTS CHUNK_BYTES
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "plexus/aggregation/client.hpp"

namespace pa = plexus::aggregation;

int main(int argc, char** argv) {
  if (argc < 8) return 2;
  pa::ClientOptions o;
  o.backend = *plexus::transport::ParseBackend(argv[1]);
  o.addresses = absl::StrSplit(argv[2], ',');
  o.ns = {static_cast<uint32_t>(std::stoul(argv[3])), std::stoull(argv[4])};
  o.worker = std::atoi(argv[5]);
  const size_t n = std::stoul(argv[6]);
  o.chunk_bytes = std::stoul(argv[7]);
  auto client = pa::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  std::vector<float> v(n, 0.0f);
  if (auto s = (*client)->Init(1, plexus::collectives::DataType::kF32, v.data(), n); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // the test kills it long before
  return 3;
}
