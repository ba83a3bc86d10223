// The verbs backend on real RDMA hardware: two devices of one process connected over the
// loopback of the first RDMA device (messages, scatter-gather, held messages, one-sided writes
// with and without immediates, errors). Where no RDMA device exists the program prints why and
// exits 77, which CTest reports as skipped.
//
// PLEXUS_VERBS_DEVICE picks the device (name or local IP, as DeviceOptions::local_address).
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/memory.hpp"
#include "support/skip.hpp"

namespace plexus::transport {
namespace {

void RequireVerbs() {
  std::string why;
  if (!Device::Available(Backend::kVerbs, &why)) plexus::testing::SkipTest(why);
}

DeviceOptions Options(ProgressMode mode) {
  DeviceOptions o;
  o.backend = Backend::kVerbs;
  o.progress = mode;
  if (const char* dev = std::getenv("PLEXUS_VERBS_DEVICE")) o.local_address = dev;
  o.op_timeout = absl::Seconds(5);
  o.connect_timeout = absl::Seconds(5);
  return o;
}

struct Loopback {
  std::shared_ptr<Device> server_device, client_device;
  std::unique_ptr<CompletionQueue> server_cq, client_cq;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> server, client;
};

Loopback Connect(ProgressMode mode) {
  Loopback l;
  absl::StatusOr<std::shared_ptr<Device>> s = Device::Create(Options(mode));
  REQUIRE(s.ok());
  absl::StatusOr<std::shared_ptr<Device>> c = Device::Create(Options(mode));
  REQUIRE(c.ok());
  l.server_device = *s;
  l.client_device = *c;
  l.server_cq = l.server_device->CreateCompletionQueue();
  l.client_cq = l.client_device->CreateCompletionQueue();
  absl::StatusOr<std::unique_ptr<Listener>> listener = l.server_device->Listen("");
  INFO(listener.status().ToString());
  REQUIRE(listener.ok());
  l.listener = std::move(*listener);
  const std::string address = l.listener->address();
  auto connecting = std::async(
      std::launch::async, [&] { return l.client_device->Connect(address, l.client_cq.get()); });
  absl::StatusOr<std::unique_ptr<Connection>> accepted =
      l.listener->Accept(l.server_cq.get(), absl::Seconds(10));
  absl::StatusOr<std::unique_ptr<Connection>> connected = connecting.get();
  INFO(accepted.status().ToString() << " / " << connected.status().ToString());
  REQUIRE(accepted.ok());
  REQUIRE(connected.ok());
  l.server = std::move(*accepted);
  l.client = std::move(*connected);
  return l;
}

Completion Next(CompletionQueue& cq) {
  absl::StatusOr<Completion> c = cq.Wait(absl::Seconds(10));
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *c;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 31 + i * 7 + (i >> 10));
  return v;
}

TEST_CASE("verbs loopback: messages, scatter-gather and held messages", "[verbs]") {
  RequireVerbs();
  for (ProgressMode mode : {ProgressMode::kThread, ProgressMode::kCaller}) {
    INFO("progress mode " << static_cast<int>(mode));
    Loopback l = Connect(mode);
    const std::vector<size_t> sizes = {0, 1, 4096, 100 << 10, 8 << 20};
    std::vector<std::vector<uint8_t>> sent, got;
    // Every receive is posted after the sends completed: the backend holds the messages.
    for (size_t i = 0; i < sizes.size(); ++i) {
      sent.push_back(Pattern(sizes[i], static_cast<uint32_t>(i)));
      got.emplace_back(sizes[i] + 1);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      REQUIRE(l.client->PostSend(ConstBuffer{sent[i].data(), sent[i].size()}, i).ok());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      Completion c = Next(*l.client_cq);
      CHECK(c.opcode == Opcode::kSend);
      CHECK(c.wr_id == i);
      CHECK(c.status.ok());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      REQUIRE(l.server->PostRecv({got[i].data(), got[i].size()}, 100 + i).ok());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      Completion c = Next(*l.server_cq);
      CHECK(c.opcode == Opcode::kRecv);
      CHECK(c.wr_id == 100 + i);
      CHECK(c.status.ok());
      CHECK(c.bytes == sizes[i]);
      CHECK(c.connection_id == l.server->id());
      CHECK(std::equal(sent[i].begin(), sent[i].end(), got[i].begin()));
    }

    // Scatter-gather, server to client.
    const std::vector<uint8_t> a = Pattern(10, 1), b = Pattern(70000, 2);
    ConstBuffer parts[] = {{a.data(), a.size()}, {b.data(), b.size()}};
    std::vector<uint8_t> out(a.size() + b.size());
    REQUIRE(l.client->PostRecv({out.data(), out.size()}, 7).ok());
    REQUIRE(l.server->PostSend(absl::MakeConstSpan(parts), 8).ok());
    CHECK(Next(*l.server_cq).wr_id == 8);
    Completion r = Next(*l.client_cq);
    CHECK(r.bytes == out.size());
    CHECK(std::equal(a.begin(), a.end(), out.begin()));
    CHECK(std::equal(b.begin(), b.end(), out.begin() + a.size()));
  }
}

TEST_CASE("verbs loopback: one-sided writes with and without immediates", "[verbs]") {
  RequireVerbs();
  Loopback l = Connect(ProgressMode::kThread);
  std::vector<uint8_t> target(1 << 20, 0), source = Pattern(1 << 20, 9);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> remote =
      l.server_device->Register(target.data(), target.size());
  absl::StatusOr<std::unique_ptr<MemoryRegion>> local =
      l.client_device->Register(source.data(), source.size());
  REQUIRE(remote.ok());
  REQUIRE(local.ok());
  // The handle crosses the connection as bytes, as between processes.
  const auto encoded = (*remote)->handle().Encode();
  std::array<uint8_t, RegionHandle::kEncodedSize> received{};
  REQUIRE(l.client->PostRecv({received.data(), received.size()}, 1).ok());
  REQUIRE(l.server->PostSend(ConstBuffer{encoded.data(), encoded.size()}, 2).ok());
  REQUIRE(Next(*l.client_cq).status.ok());
  REQUIRE(Next(*l.server_cq).status.ok());
  absl::StatusOr<RegionHandle> handle = RegionHandle::Decode(received);
  REQUIRE(handle.ok());
  CHECK(handle->backend == Backend::kVerbs);
  CHECK(handle->rkey != 0);

  REQUIRE(l.client->PostWrite(**local, 0, 4096, *handle, 100, std::nullopt, 3).ok());
  Completion w = Next(*l.client_cq);
  CHECK(w.opcode == Opcode::kWrite);
  CHECK(w.status.ok());
  CHECK(std::equal(source.begin(), source.begin() + 4096, target.begin() + 100));

  REQUIRE(l.client->PostWrite(**local, 5000, 500000, *handle, 200000, 0xABCD1234u, 4).ok());
  Completion iw = Next(*l.client_cq);
  CHECK(iw.wr_id == 4);
  CHECK(iw.status.ok());
  Completion rw = Next(*l.server_cq);
  CHECK(rw.opcode == Opcode::kRemoteWrite);
  CHECK(rw.has_immediate);
  CHECK(rw.immediate == 0xABCD1234u);
  CHECK(rw.bytes == 500000);
  CHECK(std::equal(source.begin() + 5000, source.begin() + 505000, target.begin() + 200000));

  // Out-of-range and foreign-region writes are refused at once.
  CHECK(l.client->PostWrite(**local, 0, 16, *handle, target.size() - 8, std::nullopt, 5).code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(l.client->PostWrite(**remote, 0, 16, *handle, 0, std::nullopt, 6).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("verbs loopback: closing one side fails the other's operations", "[verbs]") {
  RequireVerbs();
  Loopback l = Connect(ProgressMode::kThread);
  std::vector<uint8_t> buf(64);
  REQUIRE(l.server->PostRecv({buf.data(), buf.size()}, 1).ok());
  REQUIRE(l.client->PostRecv({buf.data(), buf.size()}, 2).ok());
  l.client->Close();
  Completion mine = Next(*l.client_cq);
  CHECK(mine.status.code() == absl::StatusCode::kCancelled);
  Completion theirs = Next(*l.server_cq);
  CHECK_FALSE(theirs.status.ok());
  INFO(theirs.status.ToString());
  CHECK_FALSE(l.server->status().ok());
}

TEST_CASE("verbs loopback: connecting where nobody listens fails clearly", "[verbs]") {
  RequireVerbs();
  absl::StatusOr<std::shared_ptr<Device>> device = Device::Create(Options(ProgressMode::kThread));
  REQUIRE(device.ok());
  auto cq = (*device)->CreateCompletionQueue();
  // Take a free port from a listener, then close it.
  std::string address;
  {
    absl::StatusOr<std::unique_ptr<Listener>> listener = (*device)->Listen("");
    REQUIRE(listener.ok());
    address = (*listener)->address();
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Connection>> c = (*device)->Connect(address, cq.get());
  REQUIRE_FALSE(c.ok());
  INFO(c.status().ToString());
  CHECK(std::string(c.status().message()).find(address) != std::string::npos);
  CHECK(absl::Now() - start < absl::Seconds(8));
  CHECK((*device)->Connect("not an address", cq.get()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace plexus::transport
