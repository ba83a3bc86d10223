// The program the launcher tests start unchanged under mpirun, torchrun, plexus-run or alone:
// Rendezvous::FromEnv, an AllGather through the store, then a full tcp mesh over which every
// rank sends (rank + 1) * 1000 + peer to every peer and sums what it receives, an allreduce done
// by hand. Every rank prints one line:
//   launch_probe rank R of N launcher L store S sum X expected X ok
// and exits 0, or prints the error on stderr and exits 1.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/transport/device.hpp"
#include "plexus/transport/mesh.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pt = plexus::transport;

namespace {

absl::Status Run(std::string* line) {
  const absl::Duration timeout = absl::Seconds(60);
  auto config = pt::ParseLaunchEnvironment(pt::ProcessEnvironment());
  if (!config.ok()) return config.status();
  auto rdzv = pt::Rendezvous::FromConfig(*config, timeout);
  if (!rdzv.ok()) return rdzv.status();
  const int rank = rdzv->rank();
  const int n = rdzv->world_size();

  auto ranks = rdzv->AllGather("probe/ranks", std::to_string(rank), timeout);
  if (!ranks.ok()) return ranks.status();
  for (int r = 0; r < n; ++r) {
    if ((*ranks)[r] != std::to_string(r)) {
      return absl::InternalError(absl::StrCat("AllGather slot ", r, " holds '", (*ranks)[r], "'"));
    }
  }

  int64_t sum = 0;
  int64_t expected = 0;
  for (int p = 0; p < n; ++p) {
    if (p != rank) expected += (p + 1) * 1000 + rank;
  }
  if (n > 1) {
    pt::DeviceOptions options;
    options.backend = pt::Backend::kTcp;
    options.progress = pt::ProgressMode::kCaller;
    options.local_address = "127.0.0.1";
    auto device = pt::Device::Create(options);
    if (!device.ok()) return device.status();
    auto cq = (*device)->CreateCompletionQueue();
    auto mesh = pt::ConnectFullMesh(*rdzv, **device, cq.get(), "probe", timeout);
    if (!mesh.ok()) return mesh.status();
    std::vector<int64_t> inbox(n, -1);
    std::vector<int64_t> outbox(n);
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      outbox[p] = (rank + 1) * 1000 + p;
      if (absl::Status s = (*mesh)[p]->PostRecv({&inbox[p], sizeof(int64_t)}, p); !s.ok()) return s;
      if (absl::Status s =
              (*mesh)[p]->PostSend(pt::ConstBuffer{&outbox[p], sizeof(int64_t)}, 1000 + p);
          !s.ok()) {
        return s;
      }
    }
    for (int done = 0; done < 2 * (n - 1); ++done) {
      auto c = cq->Wait(timeout);
      if (!c.ok()) return c.status();
      if (!c->status.ok()) return c->status;
    }
    for (int p = 0; p < n; ++p) {
      if (p != rank) sum += inbox[p];
    }
    if (absl::Status s = rdzv->Barrier("probe/done", timeout); !s.ok()) return s;
  }
  *line = absl::StrCat("launch_probe rank ", rank, " of ", n, " launcher ",
                       std::string(pt::LauncherName(rdzv->launcher())), " store ",
                       std::string(pt::StoreKindName(config->store_kind)), " sum ", sum,
                       " expected ", expected, sum == expected ? " ok" : " WRONG");
  if (sum != expected) return absl::InternalError(*line);
  return absl::OkStatus();
}

}  // namespace

int main() {
  std::string line;
  const absl::Status status = Run(&line);
  if (!status.ok()) {
    std::fprintf(stderr, "launch_probe: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return 0;
}
