// Tracing of a communicator's calls (CommunicatorOptions::trace, PLEXUS_COLL_TRACE): ranks as
// threads over inproc. Every call is recorded in issue order with its kind, bytes, algorithm and
// times; failures carry their status and later calls are recorded as refused; the ring keeps the
// newest records and counts the dropped ones; the environment writes one Chrome trace file per
// rank (and per Split child); the JSON parses and holds what Trace() holds; per-peer steps;
// reading the trace while calls run.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/collectives/communicator.hpp"
#include "plexus/collectives/trace.hpp"
#include "ranks.hpp"

namespace pc = plexus::collectives;
namespace pt = plexus::transport;
using nlohmann::json;
using pc::CollectiveKind;
using pc::DataType;
using pc::ReduceOp;

namespace {

pc::CommunicatorOptions TracedOptions(size_t capacity = 0) {
  pc::CommunicatorOptions o;
  o.device.backend = pt::Backend::kInproc;
  o.timeout = absl::Seconds(10);
  o.chunk_bytes = 4096;
  o.trace.enabled = true;
  o.trace.capacity = capacity;
  return o;
}

void RequireAllOk(const std::vector<std::string>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
}

// A fresh directory under the system's temporary directory.
std::string TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "plexus-trace-XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

// The complete ("X") events of a Chrome trace document, in file order.
std::vector<json> CallEvents(const json& doc) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == "X") out.push_back(e);
  }
  return out;
}

struct Expected {
  CollectiveKind kind;
  uint64_t bytes;
  const char* name;
};

}  // namespace

TEST_CASE("the trace records every call in issue order with its kind, bytes and times",
          "[collectives][trace]") {
  constexpr int kRanks = 4;
  std::vector<pc::CollectiveTrace> traces(kRanks);
  std::vector<std::string> jsons(kRanks);
  const int64_t before = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  auto results = pc::testing::RunRanks(kRanks, TracedOptions(), [&](int rank, pc::Communicator& c) {
    std::vector<float> small(16, 1.0f), big(20000, 1.0f), gathered(16 * kRanks);
    std::vector<int32_t> all(8 * kRanks, rank), all_out(8 * kRanks);
    std::vector<size_t> counts(kRanks, 3), displs(kRanks);
    for (int r = 0; r < kRanks; ++r) displs[r] = 3 * r;
    std::vector<int32_t> v_in(3 * kRanks, rank), v_out(3 * kRanks);
    auto check = [](absl::Status s, const char* what) {
      return s.ok() ? std::string() : std::string(what) + ": " + std::string(s.message());
    };
    std::string e;
    if (!(e = check(c.AllReduce(small.data(), small.data(), 16, DataType::kF32, ReduceOp::kSum),
                    "allreduce small"))
             .empty())
      return e;
    if (!(e = check(c.AllReduce(big.data(), big.data(), 20000, DataType::kF32, ReduceOp::kSum,
                                {pc::Algorithm::kRing}),
                    "allreduce ring"))
             .empty())
      return e;
    if (!(e = check(c.Broadcast(big.data(), big.data(), 1000, DataType::kF32, 1), "broadcast"))
             .empty())
      return e;
    if (!(e = check(c.AllGather(small.data(), gathered.data(), 16, DataType::kF32), "allgather"))
             .empty())
      return e;
    if (!(e = check(c.AllToAll(all.data(), all_out.data(), 8, DataType::kI32), "alltoall")).empty())
      return e;
    if (!(e = check(c.AllToAllV(v_in.data(), counts, displs, v_out.data(), counts, displs,
                                DataType::kI32),
                    "alltoallv"))
             .empty())
      return e;
    if (rank == 0 && !(e = check(c.Send(small.data(), 16, DataType::kF32, 1), "send")).empty())
      return e;
    if (rank == 1 && !(e = check(c.Recv(small.data(), 16, DataType::kF32, 0), "recv")).empty())
      return e;
    // Two queued calls: the second waits for the first (issued before it started).
    auto w1 = c.AllReduceAsync(big.data(), big.data(), 20000, DataType::kF32, ReduceOp::kSum);
    auto w2 = c.ReduceScatterAsync(big.data(), small.data(), 16, DataType::kF32, ReduceOp::kSum);
    if (!(e = check(w1->Wait(), "async allreduce")).empty()) return e;
    if (!(e = check(w2->Wait(), "async reducescatter")).empty()) return e;
    if (!(e = check(c.Barrier(), "barrier")).empty()) return e;
    traces[rank] = c.Trace();
    jsons[rank] = c.TraceJson();
    return std::string();
  });
  RequireAllOk(results);
  const std::vector<Expected> collective = {
      {CollectiveKind::kAllReduce, 16 * 4, "allreduce"},
      {CollectiveKind::kAllReduce, 20000 * 4, "allreduce"},
      {CollectiveKind::kBroadcast, 1000 * 4, "broadcast"},
      {CollectiveKind::kAllGather, 16 * 4 * kRanks, "allgather"},
      {CollectiveKind::kAllToAll, 8 * 4 * kRanks, "alltoall"},
      {CollectiveKind::kAllToAllV, 3 * 4 * kRanks, "alltoallv"},
  };
  const std::vector<Expected> tail = {
      {CollectiveKind::kAllReduce, 20000 * 4, "allreduce"},
      {CollectiveKind::kReduceScatter, 16 * 4 * kRanks, "reducescatter"},
      {CollectiveKind::kBarrier, 1, "barrier"},
  };
  for (int rank = 0; rank < kRanks; ++rank) {
    INFO("rank " << rank);
    const pc::CollectiveTrace& t = traces[rank];
    CHECK(t.enabled);
    CHECK(t.rank == rank);
    CHECK(t.size == kRanks);
    CHECK(t.communicator == traces[0].communicator);
    CHECK(t.dropped == 0);
    CHECK(t.capacity == pc::kDefaultTraceCapacity);
    std::vector<Expected> expected = collective;
    const bool p2p = rank <= 1;
    if (p2p) expected.push_back({CollectiveKind::kSendRecv, 16 * 4, rank == 0 ? "send" : "recv"});
    expected.insert(expected.end(), tail.begin(), tail.end());
    REQUIRE(t.events.size() == expected.size());
    CHECK(t.recorded == expected.size());
    uint64_t next_seq = 0;
    int64_t last_end = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO("event " << i);
      const pc::TraceEvent& ev = t.events[i];
      REQUIRE(ev.kind.has_value());
      CHECK(*ev.kind == expected[i].kind);
      CHECK(ev.bytes == expected[i].bytes);
      CHECK(ev.status.ok());
      CHECK(ev.issue_ns >= before);
      CHECK(ev.issue_ns <= ev.start_ns);
      CHECK(ev.start_ns <= ev.end_ns);
      CHECK(ev.start_ns >= last_end);  // one at a time, in issue order
      last_end = ev.end_ns;
      if (*ev.kind == CollectiveKind::kSendRecv) {
        CHECK(ev.is_send == (rank == 0));
        CHECK(ev.peer == 1 - rank);
        CHECK(ev.sequence == 0);
        CHECK(ev.path == pc::TracePath::kPlan);
        continue;
      }
      CHECK(ev.sequence == next_seq++);  // the header's number: equal on every rank
    }
    // How they moved: the small allreduce by mailbox, the big one by a ring plan.
    CHECK(t.events[0].path == pc::TracePath::kMailbox);
    CHECK(t.events[1].path == pc::TracePath::kPlan);
    CHECK(t.events[1].algorithm == pc::Algorithm::kRing);
    CHECK(t.events[1].channels == 1);
    CHECK(t.events[1].messages > 0);
    CHECK(t.events[2].root == 1);
    // The queued reducescatter was issued before the allreduce ahead of it ended.
    const pc::TraceEvent& rs = t.events[expected.size() - 2];
    CHECK(rs.issue_ns <= t.events[expected.size() - 3].end_ns);

    // The JSON holds the same calls.
    const json doc = json::parse(jsons[rank]);
    CHECK(doc.at("otherData").at("plexus_collectives_trace") == 1);
    CHECK(doc.at("otherData").at("rank") == rank);
    CHECK(doc.at("otherData").at("dropped") == 0);
    CHECK(doc.at("otherData").at("anchor_wall_ns").get<int64_t>() > 1'600'000'000'000'000'000);
    const std::vector<json> calls = CallEvents(doc);
    REQUIRE(calls.size() == expected.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      INFO("json event " << i);
      CHECK(calls[i].at("name") == expected[i].name);
      CHECK(calls[i].at("pid") == rank);
      CHECK(calls[i].at("args").at("bytes") == expected[i].bytes);
      CHECK(calls[i].at("args").at("status") == "OK");
      CHECK(calls[i].at("args").at("start_ns") == t.events[i].start_ns);
      CHECK(calls[i].at("dur").get<double>() >= 0);
    }
    CHECK(calls[1].at("args").at("algorithm") == "ring");
    CHECK(calls[1].at("args").at("op") == "sum");
    CHECK(calls[2].at("args").at("root") == 1);
  }
}

TEST_CASE("a failed call is recorded with its status and later calls as refused",
          "[collectives][trace]") {
  constexpr int kRanks = 3;
  std::vector<pc::CollectiveTrace> traces(kRanks);
  auto results = pc::testing::RunRanks(kRanks, TracedOptions(), [&](int rank, pc::Communicator& c) {
    std::vector<float> v(64, 1);
    absl::Status ok = c.AllReduce(v.data(), v.data(), 12, DataType::kF32, ReduceOp::kSum);
    absl::Status bad =
        c.AllReduce(v.data(), v.data(), rank == 1 ? 10 : 12, DataType::kF32, ReduceOp::kSum);
    absl::Status refused = c.AllReduce(v.data(), v.data(), 4, DataType::kF32, ReduceOp::kSum);
    traces[rank] = c.Trace();
    if (!ok.ok()) return "first call: " + std::string(ok.message());
    // A rank that only sent in the mismatched call may learn of it at its next call.
    if (bad.ok() && refused.ok()) return std::string("the communicator stayed usable");
    return std::string();
  });
  RequireAllOk(results);
  int refused_records = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    INFO("rank " << rank);
    const pc::CollectiveTrace& t = traces[rank];
    REQUIRE(t.events.size() == 3);
    CHECK(t.events[0].status.ok());
    REQUIRE(t.events[1].kind.has_value());
    CHECK(*t.events[1].kind == CollectiveKind::kAllReduce);
    CHECK(t.events[1].sequence == 1);
    CHECK(t.events[1].start_ns <= t.events[1].end_ns);
    // The first failure is recorded with its status; a call after it is refused at once.
    const size_t failed = t.events[1].status.ok() ? 2 : 1;
    CHECK(!t.events[failed].status.ok());
    if (failed == 1) {
      ++refused_records;
      CHECK(!t.events[2].kind.has_value());
      CHECK(t.events[2].status == t.events[1].status);
    }
    const json doc = json::parse(pc::ToChromeTraceJson(t));
    const std::vector<json> calls = CallEvents(doc);
    REQUIRE(calls.size() == 3);
    CHECK(calls[failed].at("args").at("status") != "OK");
    CHECK(calls[failed].at("args").at("error").get<std::string>() ==
          std::string(t.events[failed].status.message()));
    CHECK(calls[failed].at("cat") == "collective,failed");
    if (failed == 1) CHECK(calls[2].at("name") == "refused");
  }
  CHECK(refused_records > 0);  // the mismatched rank itself fails in the mismatched call
}

TEST_CASE("the ring keeps the newest records and counts the dropped ones", "[collectives][trace]") {
  constexpr int kCalls = 12;
  constexpr size_t kCapacity = 5;
  std::vector<pc::CollectiveTrace> traces(2);
  auto results =
      pc::testing::RunRanks(2, TracedOptions(kCapacity), [&](int rank, pc::Communicator& c) {
        std::vector<int64_t> v(4, rank);
        for (int i = 0; i < kCalls; ++i) {
          if (absl::Status s = c.AllReduce(v.data(), v.data(), 4, DataType::kI64, ReduceOp::kSum);
              !s.ok()) {
            return std::string(s.message());
          }
        }
        traces[rank] = c.Trace();
        return std::string();
      });
  RequireAllOk(results);
  for (const pc::CollectiveTrace& t : traces) {
    CHECK(t.capacity == kCapacity);
    CHECK(t.recorded == kCalls);
    CHECK(t.dropped == kCalls - kCapacity);
    REQUIRE(t.events.size() == kCapacity);
    for (size_t i = 0; i < kCapacity; ++i) CHECK(t.events[i].sequence == kCalls - kCapacity + i);
    const json doc = json::parse(pc::ToChromeTraceJson(t));
    CHECK(doc.at("otherData").at("dropped") == kCalls - kCapacity);
    CHECK(CallEvents(doc).size() == kCapacity);
  }
}

TEST_CASE("tracing is off by default and the trace is then empty", "[collectives][trace]") {
  pc::CommunicatorOptions o = TracedOptions();
  o.trace = {};
  auto results = pc::testing::RunRanks(2, o, [&](int, pc::Communicator& c) {
    std::vector<float> v(4, 1);
    if (absl::Status s = c.AllReduce(v.data(), v.data(), 4, DataType::kF32, ReduceOp::kSum);
        !s.ok()) {
      return std::string(s.message());
    }
    const pc::CollectiveTrace t = c.Trace();
    if (t.enabled || !t.events.empty() || c.options().trace.enabled) return std::string("traced");
    const json doc = json::parse(c.TraceJson());
    if (!CallEvents(doc).empty() || doc.at("otherData").at("enabled") != false) {
      return std::string("the JSON of an untraced communicator has calls");
    }
    return std::string();
  });
  RequireAllOk(results);
}

TEST_CASE("PLEXUS_COLL_TRACE writes one Chrome trace per rank and per Split child",
          "[collectives][trace]") {
  const std::string dir = TempDir();
  const std::string prefix = dir + "/run";
  setenv("PLEXUS_COLL_TRACE", prefix.c_str(), 1);
  pc::CommunicatorOptions o = TracedOptions();
  o.trace = {};  // the environment alone turns it on
  std::mutex mu;
  std::vector<uint64_t> child_ids;
  auto results = pc::testing::RunRanks(2, o, [&](int rank, pc::Communicator& c) {
    if (!c.options().trace.enabled || c.options().trace.path_prefix != prefix) {
      return std::string("the environment did not turn tracing on");
    }
    std::vector<float> v(4, 1);
    for (int i = 0; i < 3; ++i) {
      if (absl::Status s = c.AllReduce(v.data(), v.data(), 4, DataType::kF32, ReduceOp::kSum);
          !s.ok()) {
        return std::string(s.message());
      }
    }
    auto child = c.Split(0, rank);
    if (!child.ok()) return "split: " + std::string(child.status().message());
    if (absl::Status s = (*child)->Barrier(); !s.ok()) return std::string(s.message());
    std::lock_guard<std::mutex> lock(mu);
    child_ids.push_back((*child)->Trace().communicator);
    return std::string();
  });
  unsetenv("PLEXUS_COLL_TRACE");
  RequireAllOk(results);
  REQUIRE(child_ids.size() == 2);
  CHECK(child_ids[0] == child_ids[1]);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    auto text = plexus::base::ReadFile(prefix + "." + std::to_string(rank) + ".json");
    REQUIRE(text.ok());
    const json doc = json::parse(*text);
    CHECK(doc.at("otherData").at("rank") == rank);
    CHECK(doc.at("otherData").at("tag") == "coll");
    // Three allreduces, Split's allgather of colors, and the destructor's barrier.
    const std::vector<json> calls = CallEvents(doc);
    REQUIRE(calls.size() == 5);
    for (int i = 0; i < 3; ++i) CHECK(calls[i].at("name") == "allreduce");
    CHECK(calls[3].at("name") == "allgather");
    CHECK(calls[4].at("name") == "barrier");
    // The child's file is named by its communicator id: its barrier and the destructor's.
    char id[17];
    std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(child_ids[0]));
    auto child_text =
        plexus::base::ReadFile(prefix + "." + id + "." + std::to_string(rank) + ".json");
    REQUIRE(child_text.ok());
    const json child_doc = json::parse(*child_text);
    CHECK(child_doc.at("otherData").at("communicator") == id);
    CHECK(CallEvents(child_doc).size() == 2);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a malformed trace capacity is refused at creation", "[collectives][trace]") {
  setenv("PLEXUS_COLL_TRACE_CAPACITY", "0", 1);
  auto results = pc::testing::RunRanks(1, TracedOptions(), [](int, pc::Communicator&) {
    return std::string("created with PLEXUS_COLL_TRACE_CAPACITY=0");
  });
  unsetenv("PLEXUS_COLL_TRACE_CAPACITY");
  REQUIRE(results.size() == 1);
  CHECK(results[0].find("PLEXUS_COLL_TRACE_CAPACITY") != std::string::npos);
  pc::CommunicatorOptions huge = TracedOptions(size_t{1} << 30);
  results = pc::testing::RunRanks(1, huge, [](int, pc::Communicator&) {
    return std::string("created with a capacity of 2^30");
  });
  CHECK(results[0].find("trace.capacity") != std::string::npos);
}

TEST_CASE("peer steps record each ring neighbour's first send and last receive",
          "[collectives][trace]") {
  constexpr int kRanks = 4;
  pc::CommunicatorOptions o = TracedOptions();
  o.trace.peer_steps = true;
  std::vector<pc::CollectiveTrace> traces(kRanks);
  auto results = pc::testing::RunRanks(kRanks, o, [&](int rank, pc::Communicator& c) {
    std::vector<float> small(4, 1.0f), big(20000, 1.0f);
    if (absl::Status s = c.AllReduce(big.data(), big.data(), big.size(), DataType::kF32,
                                     ReduceOp::kSum, {pc::Algorithm::kRing});
        !s.ok()) {
      return std::string(s.message());
    }
    if (absl::Status s = c.AllReduce(small.data(), small.data(), 4, DataType::kF32, ReduceOp::kSum);
        !s.ok()) {
      return std::string(s.message());
    }
    traces[rank] = c.Trace();
    return std::string();
  });
  RequireAllOk(results);
  for (int rank = 0; rank < kRanks; ++rank) {
    INFO("rank " << rank);
    const pc::CollectiveTrace& t = traces[rank];
    REQUIRE(t.events.size() == 2);
    const pc::TraceEvent& ring = t.events[0];
    // The ring sends to the next rank and receives from the previous one, nothing else.
    REQUIRE(ring.peers.size() == 2);
    const int next = (rank + 1) % kRanks, prev = (rank + kRanks - 1) % kRanks;
    for (const pc::TracePeerStep& p : ring.peers) {
      INFO("peer " << p.peer);
      CHECK((p.peer == next || p.peer == prev));
      if (p.peer == next) {
        CHECK(p.sends > 0);
        CHECK(p.recvs == 0);
        CHECK(p.first_send_ns >= ring.start_ns);
        CHECK(p.first_send_ns <= ring.end_ns);
      } else {
        CHECK(p.recvs > 0);
        CHECK(p.sends == 0);
        CHECK(p.last_recv_ns >= ring.start_ns);
        CHECK(p.last_recv_ns <= ring.end_ns);
      }
    }
    // The message counts add up to the plan's.
    CHECK(ring.peers[0].sends + ring.peers[0].recvs + ring.peers[1].sends + ring.peers[1].recvs ==
          ring.messages);
    CHECK(t.events[1].path == pc::TracePath::kMailbox);
    CHECK(t.events[1].peers.empty());
    const json doc = json::parse(pc::ToChromeTraceJson(t));
    const std::vector<json> calls = CallEvents(doc);
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].at("args").at("peers").size() == 2);
    CHECK(!calls[1].at("args").contains("peers"));
  }
}

TEST_CASE("the trace can be read while calls run", "[collectives][trace]") {
  constexpr int kCalls = 300;
  std::atomic<bool> done{false};
  std::atomic<int> snapshots{0};
  std::string reader_error;
  // Rank 0's communicator while it runs; the reader holds watch_mu while it reads it.
  std::mutex watch_mu;
  pc::Communicator* watched = nullptr;
  std::thread reader([&] {
    uint64_t last_recorded = 0;
    while (!done.load()) {
      {
        std::lock_guard<std::mutex> lock(watch_mu);
        if (watched != nullptr) {
          const pc::CollectiveTrace t = watched->Trace();
          const json doc = json::parse(watched->TraceJson());
          if (t.recorded < last_recorded) reader_error = "recorded went backwards";
          last_recorded = t.recorded;
          for (size_t i = 1; i < t.events.size(); ++i) {
            if (t.events[i].start_ns < t.events[i - 1].end_ns) reader_error = "out of order";
          }
          if (CallEvents(doc).size() > t.capacity) reader_error = "more events than capacity";
          ++snapshots;
        }
      }
      std::this_thread::yield();
    }
  });
  auto results = pc::testing::RunRanks(2, TracedOptions(64), [&](int rank, pc::Communicator& c) {
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(watch_mu);
      watched = &c;
    }
    std::vector<int32_t> v(8, rank);
    std::string error;
    for (int i = 0; i < kCalls && error.empty(); ++i) {
      absl::Status s = c.AllReduce(v.data(), v.data(), 8, DataType::kI32, ReduceOp::kMax);
      if (!s.ok()) error = std::string(s.message());
    }
    if (rank == 0) {
      // Let the reader see the finished trace once, then stop it before `c` goes away.
      const int seen = snapshots.load();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (snapshots.load() < seen + 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      std::lock_guard<std::mutex> lock(watch_mu);
      watched = nullptr;
    }
    return error;
  });
  done = true;
  reader.join();
  RequireAllOk(results);
  CHECK(reader_error == "");
  CHECK(snapshots.load() > 0);
}
