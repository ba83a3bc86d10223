// One rank of the multi-process collectives tests (started by process_test.cpp):
//   collectives_peer <rank> <size> <store host:port> <backend> <mode> [victim [timeout_ms bytes]]
// modes: suite (the full correctness matrix), reconfig (a live ring order change from the last
// rank), reconfig-transport (tcp -> shm -> tcp, or shm -> tcp -> shm, requested by the last rank
// and then rank 0), reconfig-channels (4 channels, then 2, requested likewise), kill (the victim
// dies mid-run; the others must fail with an error naming it), mismatch (rank 1 calls with another
// count), first-message (placed collectives whose first message on a link is 6-128 KiB, where its
// header may travel apart or be taken apart on the way, checked element by element; then an
// all-gather with rank 1's count differing, which must fail on every rank), stop (allreduces of
// `bytes` until one fails: the test SIGSTOPs the victim once it printed "running"), stop-destroy (a
// few allreduces, then the victim stays out of the destructor's barrier and is stopped). Exit 0
// when this rank saw what it should; the reason is printed otherwise. The stop modes print the
// CLOCK_MONOTONIC nanoseconds of the failure and of the destructor's end for the test to measure
// from the moment it stopped the victim.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/reconfiguration.hpp"
#include "plexus/transport/store.hpp"
#include "suite.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;

// Call `i` of the reconfiguration modes: an i64 sum allreduce of v[e] = e * (rank + 1) + i,
// every element checked; false (after printing why) on an error or a wrong element.
bool CheckedSum(pc::Communicator& c, int rank, int size, int i, std::vector<int64_t>& v,
                std::vector<int64_t>& sum) {
  for (size_t e = 0; e < v.size(); ++e) v[e] = static_cast<int64_t>(e) * (rank + 1) + i;
  absl::Status s =
      c.AllReduce(v.data(), sum.data(), v.size(), pc::DataType::kI64, pc::ReduceOp::kSum);
  if (!s.ok()) {
    std::printf("rank %d: %s\n", rank, std::string(s.message()).c_str());
    return false;
  }
  const int64_t ranks_sum = static_cast<int64_t>(size) * (size + 1) / 2;
  for (size_t e = 0; e < v.size(); ++e) {
    if (sum[e] != static_cast<int64_t>(e) * ranks_sum + static_cast<int64_t>(i) * size) {
      std::printf("rank %d: call %d element %zu wrong\n", rank, i, e);
      return false;
    }
  }
  return true;
}

// The reconfiguration modes' two changes: the last rank asks for `there` after two calls, rank 0
// for `back` two calls after it landed; every call is a CheckedSum. `on_first_landing` runs on
// the first call that ran with `there`. The ranks then compare where both changes landed.
// Returns {the call `there` landed on, the sequence `back` took effect from}, or nullopt after
// printing why.
std::optional<std::pair<int64_t, int64_t>> ChangeThereAndBack(
    pc::Communicator& c, int rank, int size, const pc::Reconfiguration& there,
    const pc::Reconfiguration& back, const std::function<bool()>& on_first_landing) {
  std::vector<int64_t> v(50000), sum(50000);
  int64_t first_landed_at = -1;
  for (int i = 0; i < 8 || c.configuration().epoch < 2; ++i) {
    if (i > 200) {
      std::printf("rank %d: the changes never landed\n", rank);
      return std::nullopt;
    }
    const pc::Reconfiguration* change = nullptr;
    if (rank == size - 1 && i == 2) {
      change = &there;
    } else if (rank == 0 && first_landed_at >= 0 && i == first_landed_at + 2) {
      change = &back;
    }
    if (change != nullptr) {
      if (auto e = c.RequestReconfiguration(*change); !e.ok()) {
        std::printf("rank %d: %s\n", rank, std::string(e.status().message()).c_str());
        return std::nullopt;
      }
    }
    if (!CheckedSum(c, rank, size, i, v, sum)) return std::nullopt;
    if (c.configuration().epoch == 1 && first_landed_at < 0) {
      first_landed_at = i;
      if (!on_first_landing()) return std::nullopt;
    }
  }
  std::vector<int64_t> mine = {static_cast<int64_t>(c.configuration().since_sequence),
                               first_landed_at};
  std::vector<int64_t> all(2 * size);
  if (!c.AllGather(mine.data(), all.data(), 2, pc::DataType::kI64).ok()) return std::nullopt;
  for (int r = 0; r < size; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      std::printf("rank %d: landed on %lld and %lld, rank %d on %lld and %lld\n", rank,
                  static_cast<long long>(all[1]), static_cast<long long>(all[0]), r,
                  static_cast<long long>(all[2 * r + 1]), static_cast<long long>(all[2 * r]));
      return std::nullopt;
    }
  }
  return std::make_pair(all[1], all[0]);
}

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
  const bool stop_mode = mode == "stop" || mode == "stop-destroy";
  const int timeout_ms = argc > 7 ? std::atoi(argv[7]) : 5000;
  const size_t stop_bytes = argc > 8 ? std::strtoull(argv[8], nullptr, 10) : 8;
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
  options.device.backend = *backend;
  options.transport_policy = pc::TransportPolicy::kUniform;  // test the backend named
  options.device.local_address = *backend == pt::Backend::kTcp ? "127.0.0.1" : "";
  options.timeout =
      stop_mode ? absl::Milliseconds(timeout_ms) : absl::Seconds(mode == "suite" ? 30 : 5);
  options.chunk_bytes = mode == "suite" ? 1024 : 0;
  if (mode == "first-message") options.timeout = absl::Seconds(10);
  auto comm = pc::Communicator::Create(*rdv, options);
  if (!comm.ok()) {
    std::printf("create: %s\n", std::string(comm.status().message()).c_str());
    return 1;
  }
  pc::Communicator& c = **comm;
  auto now_ns = [] {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
  };

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
  if (mode == "stop") {
    std::vector<float> v(std::max<size_t>(stop_bytes / sizeof(float), 1), 1.0f);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (int i = 0; std::chrono::steady_clock::now() < give_up; ++i) {
      absl::Status s =
          c.AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32, pc::ReduceOp::kMax);
      if (rank == victim && i == 3) {
        std::printf("running\n");
        std::fflush(stdout);
      }
      if (!s.ok()) {
        const long long failed = now_ns();
        std::printf("rank %d failed at %lld: [%s] %s\n", rank, failed,
                    absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str());
        comm->reset();
        std::printf("rank %d closed at %lld\n", rank, now_ns());
        return 0;
      }
    }
    std::printf("rank %d: no error although rank %d stopped\n", rank, victim);
    return 1;
  }
  if (mode == "stop-destroy") {
    std::vector<float> v(std::max<size_t>(stop_bytes / sizeof(float), 1), 1.0f);
    for (int i = 0; i < 4; ++i) {
      absl::Status s =
          c.AllReduce(v.data(), v.data(), v.size(), pc::DataType::kF32, pc::ReduceOp::kMax);
      if (!s.ok()) {
        std::printf("rank %d: call %d failed: %s\n", rank, i, std::string(s.message()).c_str());
        return 1;
      }
    }
    if (rank == victim) {
      std::printf("running\n");
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // stopped, then killed
    }
    const long long entered = now_ns();
    comm->reset();  // the barrier waits for the victim
    std::printf("rank %d destroyed from %lld to %lld\n", rank, entered, now_ns());
    return 0;
  }
  if (mode == "reconfig") {
    // The last rank requests a reversed ring order after two calls; every rank then calls on
    // until the change landed, checks each sum, and compares its landing sequence with the
    // others' (gathered by the communicator itself).
    std::vector<int64_t> v(50000), sum(50000);
    std::vector<int> reversed(size);
    for (int r = 0; r < size; ++r) reversed[r] = size - 1 - r;
    for (int i = 0; i < 6 || c.configuration().epoch < 1; ++i) {
      if (i > 100) {
        std::printf("rank %d: the change never landed\n", rank);
        return 1;
      }
      if (rank == size - 1 && i == 2) {
        pc::Reconfiguration change;
        change.ring_order = reversed;
        if (auto e = c.RequestReconfiguration(change); !e.ok()) {
          std::printf("rank %d: %s\n", rank, std::string(e.status().message()).c_str());
          return 1;
        }
      }
      if (!CheckedSum(c, rank, size, i, v, sum)) return 1;
    }
    const pc::ActiveConfiguration a = c.configuration();
    std::vector<int64_t> mine = {static_cast<int64_t>(a.since_sequence)};
    std::vector<int64_t> all(size);
    if (!c.AllGather(mine.data(), all.data(), 1, pc::DataType::kI64).ok()) return 1;
    for (int r = 0; r < size; ++r) {
      if (all[r] != all[0]) {
        std::printf("rank %d: landed on %lld, rank %d on %lld\n", rank,
                    static_cast<long long>(all[0]), r, static_cast<long long>(all[r]));
        return 1;
      }
    }
    if (a.ring_order != reversed) return 1;
    std::printf("rank %d: landed on collective %lld\n", rank, static_cast<long long>(all[0]));
    return 0;
  }
  if (mode == "reconfig-transport") {
    // The last rank asks for the other transport after two calls, rank 0 for the first one back
    // two calls after that landed; every sum is checked, every rank must report the transport
    // of each phase, and the landing sequences must agree.
    const pt::Backend other = *backend == pt::Backend::kTcp ? pt::Backend::kShm : pt::Backend::kTcp;
    auto check_peers = [&](pt::Backend expected) {
      for (int r = 0; r < size; ++r) {
        if (r != rank && c.peer_backend(r) != expected) {
          std::printf("rank %d: rank %d is reached over %s, expected %s\n", rank, r,
                      std::string(pt::BackendName(c.peer_backend(r))).c_str(),
                      std::string(pt::BackendName(expected)).c_str());
          return false;
        }
      }
      return true;
    };
    pc::Reconfiguration there, back;
    there.transport = pc::TransportChoice{other, pc::TransportPolicy::kUniform};
    back.transport = pc::TransportChoice{*backend, pc::TransportPolicy::kUniform};
    const auto landed =
        ChangeThereAndBack(c, rank, size, there, back, [&] { return check_peers(other); });
    if (!landed || !check_peers(*backend)) return 1;
    std::printf("rank %d: %s -> %s landed on collective %lld, back on %lld\n", rank,
                std::string(pt::BackendName(*backend)).c_str(),
                std::string(pt::BackendName(other)).c_str(), static_cast<long long>(landed->first),
                static_cast<long long>(landed->second));
    return 0;
  }
  if (mode == "reconfig-channels") {
    // The last rank asks for 4 channels after two calls, rank 0 for 2 two calls after that
    // landed; every sum is checked, every rank must report the count of each phase, and the
    // landing sequences must agree.
    pc::Reconfiguration there, back;
    there.channels = 4;
    back.channels = 2;
    const auto landed = ChangeThereAndBack(c, rank, size, there, back, [&] {
      if (c.configuration().channels == 4 && c.options().channels == 4) return true;
      std::printf("rank %d: %d channel(s) after the change to 4\n", rank,
                  c.configuration().channels);
      return false;
    });
    if (!landed) return 1;
    if (c.configuration().channels != 2 || c.options().channels != 2) {
      std::printf("rank %d: %d channel(s) after the change to 2\n", rank,
                  c.configuration().channels);
      return 1;
    }
    std::printf("rank %d: 4 channels landed on collective %lld, 2 on %lld\n", rank,
                static_cast<long long>(landed->first), static_cast<long long>(landed->second));
    return 0;
  }
  if (mode == "first-message") {
    // Element counts of int32 whose messages are 6,000 B, 16 KiB, odd, just below and at 128 KiB.
    int wrong = 0, calls = 0;
    auto fail = [&](const char* what, size_t count, absl::Status s) {
      std::printf("rank %d: %s of %zu: %s\n", rank, what, count, std::string(s.message()).c_str());
      return 1;
    };
    for (size_t count : {size_t{1500}, size_t{4096}, size_t{10001}, size_t{32700}, size_t{32768}}) {
      for (int root : {0, size - 1}) {
        std::vector<int32_t> v(count);
        for (size_t i = 0; i < count; ++i) {
          v[i] = rank == root ? static_cast<int32_t>(i * 3 + root) : -1;
        }
        if (absl::Status s = c.Broadcast(v.data(), v.data(), count, pc::DataType::kI32, root);
            !s.ok()) {
          return fail("broadcast", count, s);
        }
        for (size_t i = 0; i < count; ++i) wrong += v[i] != static_cast<int32_t>(i * 3 + root);
        ++calls;
      }
      // AllGather and AllToAll of `count` elements per block.
      std::vector<int32_t> mine(count), all(count * size, -1);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(rank * 1000003 + i);
      if (absl::Status s = c.AllGather(mine.data(), all.data(), count, pc::DataType::kI32);
          !s.ok()) {
        return fail("allgather", count, s);
      }
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < count; ++i) {
          wrong += all[q * count + i] != static_cast<int32_t>(q * 1000003 + i);
        }
      }
      std::vector<int32_t> out(count * size), in(count * size, -1);
      for (int p = 0; p < size; ++p) {
        for (size_t i = 0; i < count; ++i) {
          out[p * count + i] = static_cast<int32_t>(rank * 7919 + p * 131 + i);
        }
      }
      if (absl::Status s = c.AllToAll(out.data(), in.data(), count, pc::DataType::kI32); !s.ok()) {
        return fail("alltoall", count, s);
      }
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < count; ++i) {
          wrong += in[q * count + i] != static_cast<int32_t>(q * 7919 + rank * 131 + i);
        }
      }
      calls += 2;
    }
    if (wrong != 0) {
      std::printf("rank %d: %d wrong elements over %d calls\n", rank, wrong, calls);
      return 1;
    }
    // An all-gather whose block counts differ (20,000 against 24,000 bytes): an error on every
    // rank, naming the mismatch where a message from rank 1, or to it, is taken apart.
    std::vector<int32_t> mine(6000, 1), all(6000 * size);
    absl::Status s =
        c.AllGather(mine.data(), all.data(), rank == 1 ? 5000 : 6000, pc::DataType::kI32);
    std::printf("rank %d: %d calls correct; mismatched all-gather: %s\n", rank, calls,
                s.ok() ? "OK" : std::string(s.message()).c_str());
    return s.ok() ? 1 : 0;
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
