// A collectives communicator whose ring runs over multipath connections: 2 ranks (threads), each
// on its own MultipathDevice with K = 2 loopback paths, AllReduce with exact results at several
// sizes, both paths carrying the large ones. The test links collectives and multipath; neither
// library depends on the other.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/multipath/device.hpp"
#include "plexus/transport/rendezvous.hpp"
#include "support/loopback.hpp"

namespace pc = plexus::collectives;
namespace pm = plexus::multipath;
namespace pt = plexus::transport;

namespace {

// Rank r's element i: exact in int32 and in float (small integers).
int32_t Value(int rank, size_t i) { return static_cast<int32_t>((i * 7 + rank * 13) % 1001); }

}  // namespace

TEST_CASE("allreduce: 2 ranks over multipath devices with 2 paths, exact at several sizes",
          "[multipath][collectives]") {
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  const std::vector<size_t> counts = {1, 7, 1000, 65536 + 3, (size_t{4} << 20) + 1};
  std::vector<std::string> errors(2);
  std::vector<std::vector<uint64_t>> path_bytes(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto fail = [&](const std::string& what, const absl::Status& s) {
        errors[r] = absl::StrCat(what, ": ", s.ToString());
      };
      pm::MultipathDeviceOptions o;
      // Distinct second paths, so each rank's paths are its own sources.
      o.local_addresses = {"127.0.0.1", r == 0 ? "127.0.0.2" : "127.0.0.3"};
      o.channel.path_timeout = absl::Seconds(3);  // a loaded 2-core CI machine
      o.device.op_timeout = absl::Seconds(30);
      auto device = pm::MultipathDevice::Create(o);
      if (!device.ok()) return fail("device", device.status());
      auto rdv = pt::Rendezvous::Create(r, 2, loopback.store);
      if (!rdv.ok()) return fail("rendezvous", rdv.status());
      pc::CommunicatorOptions options;
      options.timeout = absl::Seconds(60);
      auto comm = pc::Communicator::Create(*rdv, *device, options);
      if (!comm.ok()) return fail("communicator", comm.status());
      for (size_t count : counts) {
        std::vector<int32_t> in(count), out(count, -1);
        std::vector<float> fin(count), fout(count, -1);
        for (size_t i = 0; i < count; ++i) {
          in[i] = Value(r, i);
          fin[i] = static_cast<float>(Value(r, i));
        }
        if (absl::Status s = (*comm)->AllReduce(in.data(), out.data(), count, pc::DataType::kI32,
                                                pc::ReduceOp::kSum);
            !s.ok()) {
          return fail(absl::StrCat("i32 allreduce of ", count), s);
        }
        // In place, f32.
        if (absl::Status s = (*comm)->AllReduce(fin.data(), fin.data(), count, pc::DataType::kF32,
                                                pc::ReduceOp::kSum);
            !s.ok()) {
          return fail(absl::StrCat("f32 allreduce of ", count), s);
        }
        for (size_t i = 0; i < count; ++i) {
          const int32_t want = Value(0, i) + Value(1, i);
          if (out[i] != want || fin[i] != static_cast<float>(want)) {
            errors[r] = absl::StrCat("count ", count, " element ", i, ": i32 ", out[i], ", f32 ",
                                     fin[i], ", want ", want);
            return;
          }
        }
      }
      if (absl::Status s = (*comm)->health(); !s.ok()) return fail("health", s);
      path_bytes[r] = (*device)->PathBytesAcked();
      comm->reset();  // collective: both ranks reach it
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  // The ring ran over both paths of each rank (16 MiB messages are cut into 50 KB chunks).
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE(path_bytes[r].size() == 2);
    CHECK(path_bytes[r][0] > (size_t{1} << 20));
    CHECK(path_bytes[r][1] > (size_t{1} << 20));
  }
}
