// Allreduce between processes: the smallest complete plexus::collectives program. Start it with
// any launcher (plexus-run -n 4, mpirun -np 4, torchrun --nproc_per_node 4, srun -n 4): rank,
// world size and the store come from the environment.
//
//   build/tools/plexus-run -n 4 build/examples/allreduce
#include <cstdio>
#include <string>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

int main() {
  const size_t count = 1 << 20;
  pc::CommunicatorOptions options;
  options.device.backend = pt::Backend::kShm;  // ranks on one host; kTcp across hosts
  auto rendezvous = pt::Rendezvous::FromEnv();
  if (!rendezvous.ok()) {
    std::fprintf(stderr, "allreduce: %s\n", std::string(rendezvous.status().message()).c_str());
    return 1;
  }
  auto comm = pc::Communicator::Create(*rendezvous, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "allreduce: %s\n", std::string(comm.status().message()).c_str());
    return 1;
  }
  const int rank = (*comm)->rank(), size = (*comm)->size();

  // Every rank contributes rank+1 at every position: the sum is size*(size+1)/2 everywhere.
  std::vector<float> data(count, static_cast<float>(rank + 1));
  absl::Status status =
      (*comm)->AllReduce(data.data(), data.data(), count, pc::DataType::kF32, pc::ReduceOp::kSum);
  if (!status.ok()) {
    std::fprintf(stderr, "allreduce: rank %d: %s\n", rank, std::string(status.message()).c_str());
    return 1;
  }
  const float expected = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != expected) {
      std::fprintf(stderr, "allreduce: rank %d: element %zu is %g, expected %g\n", rank, i, data[i],
                   expected);
      return 1;
    }
  }
  std::printf("rank %d of %d: allreduce of %zu floats = %g everywhere (algorithm %s)\n", rank, size,
              count, expected,
              std::string(pc::AlgorithmName((*comm)->SelectAlgorithm(pc::CollectiveKind::kAllReduce,
                                                                     count * sizeof(float))))
                  .c_str());
  return 0;
}
