// Receives from any source (Communicator::RecvFromAny) with ranks as threads, over inproc, shm
// and tcp: every message is taken once, each sender's in its order, with its sender named; the
// per-pair matching of later Recv calls and of collectives is undisturbed; a peer whose next
// message belongs to a collective is passed over; nobody sending is a timeout.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "plexus/collectives/communicator.hpp"
#include "ranks.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
using pc::DataType;
using pc::testing::RunRanks;

namespace {

pc::CommunicatorOptions OptionsFor(pt::Backend backend) {
  pc::CommunicatorOptions o;
  o.device.backend = backend;
  if (backend == pt::Backend::kTcp) o.device.local_address = "127.0.0.1";
  o.transport_policy = pc::TransportPolicy::kUniform;
  o.timeout = absl::Seconds(20);
  o.chunk_bytes = 1024;  // several chunks (and channels) per message
  return o;
}

std::vector<float> Filled(size_t n, float v) { return std::vector<float>(n, v); }

}  // namespace

TEST_CASE("RecvFromAny takes every sender's messages once, in each sender's order",
          "[collectives][any_source]") {
  for (pt::Backend backend : {pt::Backend::kInproc, pt::Backend::kShm, pt::Backend::kTcp}) {
    DYNAMIC_SECTION(pt::BackendName(backend)) {
      constexpr int n = 4;
      constexpr size_t kCount = 3000;
      auto results = RunRanks(n, OptionsFor(backend), [&](int rank, pc::Communicator& comm) {
        if (rank != 0) {
          for (int k = 0; k < 2; ++k) {
            const std::vector<float> v = Filled(kCount, static_cast<float>(rank * 10 + k));
            if (absl::Status s = comm.Send(v.data(), kCount, DataType::kF32, 0); !s.ok()) {
              return absl::StrCat("send: ", s.message());
            }
          }
          // A third message to rank 0, which takes it with a plain Recv after the others (sent
          // once rank 0 says it took them, so that no RecvFromAny can take it).
          if (rank == 1) {
            int go = 0;
            if (absl::Status s = comm.Recv(&go, 1, DataType::kI32, 0); !s.ok()) {
              return absl::StrCat("recv go: ", s.message());
            }
            const std::vector<float> v = Filled(kCount, 77);
            if (absl::Status s = comm.Send(v.data(), kCount, DataType::kF32, 0); !s.ok()) {
              return absl::StrCat("send: ", s.message());
            }
          }
        } else {
          std::map<int, std::vector<float>> seen;
          for (int i = 0; i < 2 * (n - 1); ++i) {
            std::vector<float> got(kCount, -1);
            absl::StatusOr<int> source = comm.RecvFromAny(got.data(), kCount, DataType::kF32);
            if (!source.ok()) return absl::StrCat("RecvFromAny: ", source.status().message());
            if (got != Filled(kCount, got[0])) return std::string("a message arrived torn");
            seen[*source].push_back(got[0]);
          }
          for (int r = 1; r < n; ++r) {
            const std::vector<float> want = {static_cast<float>(r * 10),
                                             static_cast<float>(r * 10 + 1)};
            if (seen[r] != want) {
              return absl::StrCat("from rank ", r, ": ", seen[r].size(), " messages, first ",
                                  seen[r].empty() ? -1.0f : seen[r][0]);
            }
          }
          const int go = 1;
          if (absl::Status s = comm.Send(&go, 1, DataType::kI32, 1); !s.ok()) {
            return absl::StrCat("send go: ", s.message());
          }
          std::vector<float> got(kCount, -1);
          if (absl::Status s = comm.Recv(got.data(), kCount, DataType::kF32, 1); !s.ok()) {
            return absl::StrCat("recv after: ", s.message());
          }
          if (got != Filled(kCount, 77)) return std::string("the plain Recv got the wrong one");
        }
        // Collectives are undisturbed.
        float x = static_cast<float>(rank + 1);
        if (absl::Status s = comm.AllReduce(&x, &x, 1, DataType::kF32, pc::ReduceOp::kSum);
            !s.ok()) {
          return absl::StrCat("allreduce: ", s.message());
        }
        return x == 10.0f ? std::string() : absl::StrCat("allreduce gave ", x);
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(results[r] == "");
      }
    }
  }
}

TEST_CASE("RecvFromAny passes over a peer whose next message belongs to a collective",
          "[collectives][any_source]") {
  constexpr int n = 3;
  auto results = RunRanks(n, OptionsFor(pt::Backend::kTcp), [&](int rank, pc::Communicator& comm) {
    float x = 1;
    if (rank == 2) {
      const int v = 42;
      if (absl::Status s = comm.Send(&v, 1, DataType::kI32, 0); !s.ok()) {
        return absl::StrCat("send: ", s.message());
      }
    }
    if (rank == 0) {
      // Rank 1 is already in the allreduce below: its message to rank 0 is the allreduce's.
      int v = 0;
      absl::StatusOr<int> source = comm.RecvFromAny(&v, 1, DataType::kI32);
      if (!source.ok()) return absl::StrCat("RecvFromAny: ", source.status().message());
      if (*source != 2 || v != 42) return absl::StrCat("took ", v, " from rank ", *source);
    }
    if (absl::Status s = comm.AllReduce(&x, &x, 1, DataType::kF32, pc::ReduceOp::kSum); !s.ok()) {
      return absl::StrCat("allreduce: ", s.message());
    }
    return x == 3.0f ? std::string() : absl::StrCat("allreduce gave ", x);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
}

TEST_CASE("RecvFromAny with nobody sending ends with DeadlineExceeded within the timeout",
          "[collectives][any_source]") {
  // Rank 0 waits 0.5 s for a message; rank 1, meanwhile in the barrier, longer.
  auto options_of = [](int rank) {
    pc::CommunicatorOptions o = OptionsFor(pt::Backend::kInproc);
    o.timeout = rank == 0 ? absl::Milliseconds(500) : absl::Seconds(20);
    return o;
  };
  auto body = [&](int rank, pc::Communicator& comm) -> std::string {
    if (rank == 0) {
      int v = 0;
      const absl::Time start = absl::Now();
      absl::StatusOr<int> source = comm.RecvFromAny(&v, 1, DataType::kI32);
      const absl::Duration took = absl::Now() - start;
      if (source.ok()) return absl::StrCat("took a message from rank ", *source);
      if (!absl::IsDeadlineExceeded(source.status()) ||
          !absl::StrContains(source.status().message(), "RecvFromAny on rank 0")) {
        return absl::StrCat("wrong error: ", source.status().ToString());
      }
      if (took > absl::Seconds(3)) return absl::StrCat("took ", absl::FormatDuration(took));
      int* null_source = nullptr;
      if (comm.RecvFromAnyAsync(&v, 1, DataType::kI32, null_source)->Wait().ok()) {
        return std::string("a null source was accepted");
      }
    }
    // Both ranks stay until rank 0 is done (rank 1 sends nothing); the timeout consumed
    // nothing, so the communicator goes on.
    absl::Status s = comm.Barrier();
    return s.ok() ? std::string() : absl::StrCat("barrier: ", s.message());
  };
  auto results = pc::testing::RunRanksWith(2, options_of, body);
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}
