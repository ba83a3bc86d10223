// One rank of the multi-process collectives tests (started by process_test.cpp):
//   collectives_peer <rank> <size> <store host:port> <backend> <mode> [victim]
// modes: suite (the full correctness matrix), kill (the victim dies mid-run; the others must
// fail with an error naming it), mismatch (rank 1 calls with another count).
// Exit 0 when this rank saw what it should; the reason is printed otherwise.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/store.hpp"
#include "suite.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: %s rank size store backend suite|kill|kill-small|mismatch|mismatch-mixed "
                 "[victim]\n",
                 argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  const std::string mode = argv[5];
  const int victim = argc > 6 ? std::atoi(argv[6]) : -1;
  auto backend = pt::ParseBackend(argv[4]);
  if (!backend.ok()) return 2;
  auto store = pt::TcpStore::Connect(argv[3], absl::Seconds(20));
  if (!store.ok()) {
    std::printf("store: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  auto rdv = pt::Rendezvous::Create(rank, size, std::shared_ptr<pt::Store>(*std::move(store)));
  if (!rdv.ok()) return 1;
  pc::CommunicatorOptions options;
  options.backend = *backend;
  options.local_address = *backend == pt::Backend::kTcp ? "127.0.0.1" : "";
  options.timeout = absl::Seconds(mode == "suite" ? 30 : 5);
  options.chunk_bytes = mode == "suite" ? 1024 : 0;
  auto comm = pc::Communicator::Create(*rdv, options);
  if (!comm.ok()) {
    std::printf("create: %s\n", std::string(comm.status().message()).c_str());
    return 1;
  }
  pc::Communicator& c = **comm;

  if (mode == "suite") {
    pc::testing::Suite suite(c, rank % 2);
    const pc::testing::SuiteResult r = suite.Run(true);
    if (!r.error.empty()) {
      std::printf("rank %d: %s\n", rank, r.error.c_str());
      return 1;
    }
    std::printf("rank %d: %d calls correct\n", rank, r.calls);
    return 0;
  }
  if (mode == "kill" || mode == "kill-small") {
    // kill-small: 2 floats, the mailbox path on shm.
    std::vector<float> v(mode == "kill" ? 1 << 18 : 2, 1.0f);
    for (int i = 0; i < 1000; ++i) {
      if (rank == victim && i == 3) raise(SIGKILL);
      absl::Status s =
          c.AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32, pc::ReduceOp::kMax);
      if (!s.ok()) {
        const std::string msg(s.message());
        std::printf("rank %d: %s\n", rank, msg.c_str());
        const bool named = msg.find("rank " + std::to_string(victim)) != std::string::npos;
        return named && i >= 3 ? 0 : 1;
      }
    }
    std::printf("rank %d: no error although rank %d died\n", rank, victim);
    return 1;
  }
  if (mode == "mismatch" || mode == "mismatch-mixed") {
    // mismatch-mixed: rank 1's count takes a plan, the others' the mailbox path (on shm).
    std::vector<double> v(1000, 1.0);
    const size_t count = mode == "mismatch" ? (rank == 1 ? 50 : 60) : (rank == 1 ? 1000 : 2);
    absl::Status s = c.AllReduce(v.data(), v.data(), count, pc::DataType::kF64, pc::ReduceOp::kSum);
    std::printf("rank %d: %s\n", rank, s.ok() ? "OK" : std::string(s.message()).c_str());
    return s.ok() ? 1 : 0;
  }
  return 2;
}
