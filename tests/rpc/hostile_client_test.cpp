// A hostile client that opens many calls and never reads: it speaks the wire protocol on a raw
// tcp connection (127.0.0.1), sends the handshake, then 300 requests of 64 KiB for a method whose
// handler holds every call, and never posts a receive. The server must take exactly its window of
// calls, keep the rest in the transport up to its held-bytes cap and then stop reading (the
// client's sends stall): its memory is bounded by window x message size + the cap.
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "catch2/catch.hpp"
#include "codec.hpp"
#include "frame.hpp"
#include "holding_service.hpp"
#include "kinds.plexus.hpp"
#include "plexus/rpc/server.hpp"

namespace pr = plexus::rpc;
namespace pi = plexus::rpc::internal;
namespace pt = plexus::transport;
using plexus::rpctest::AllKinds;
using plexus::rpctest::Empty;
using plexus::rpctest::Inner;
using plexus::rpctest::Kinds;

namespace {

using HoldingImpl = plexus::rpctest::HoldingService;

}  // namespace

TEST_CASE("hostile client: many calls never read; the server takes its window and stops reading",
          "[rpc][hostile]") {
  constexpr size_t kWindow = 8;
  constexpr int kRequests = 300;
  constexpr size_t kHeldCap = 256 << 10;
  auto sdev = pt::Device::Create({.backend = pt::Backend::kTcp,
                                  .local_address = "127.0.0.1",
                                  .max_held_bytes_per_connection = kHeldCap,
                                  .max_held_bytes_per_device = kHeldCap * 4});
  REQUIRE(sdev.ok());
  auto server = pr::Server::Create(*sdev, {.max_in_flight_per_connection = kWindow});
  REQUIRE(server.ok());
  HoldingImpl impl;
  REQUIRE((*server)->Register(&impl).ok());
  REQUIRE((*server)->Start().ok());

  auto cdev = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  REQUIRE(cdev.ok());
  auto cq = (*cdev)->CreateCompletionQueue();
  auto conn = (*cdev)->Connect((*server)->address(), cq.get());
  REQUIRE(conn.ok());

  // The handshake, done properly (a hostile client gets this far).
  pi::OutFrame hello;
  pi::FrameHeader h;
  h.type = pi::FrameType::kHello;
  const std::vector<std::pair<std::string, std::string>> md = {
      {Kinds::Descriptor().full_name, absl::StrFormat("%016x", Kinds::Descriptor().schema_hash)}};
  pi::BuildFrame(h, "", md, nullptr, &hello);
  std::vector<uint8_t> ack(4096);
  REQUIRE((*conn)->PostRecv({ack.data(), ack.size()}, 1).ok());
  REQUIRE((*conn)->PostSend(hello.parts, 2).ok());
  for (int got = 0; got < 2;) {
    auto c = cq->Wait(absl::Seconds(10));
    REQUIRE(c.ok());
    REQUIRE(c->status.ok());
    ++got;
  }

  // 300 requests of 64 KiB (about 19 MiB, past the kernel's socket buffers), never a receive.
  const std::string name(64 << 10, 'x');
  Inner req;
  req.name = name;
  pi::EncodedMessage encoded;
  REQUIRE(pi::EncodeMessage(*Kinds::Descriptor().methods[1].request(), &req, &encoded).ok());
  std::vector<pi::OutFrame> frames(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    pi::FrameHeader rh;
    rh.type = pi::FrameType::kRequest;
    rh.call_id = static_cast<uint64_t>(i + 1);
    rh.service_id = Kinds::Descriptor().id;
    rh.method_id = 1;  // Hold
    pi::BuildFrame(rh, "", {}, &encoded, &frames[static_cast<size_t>(i)]);
    REQUIRE((*conn)->PostSend(frames[static_cast<size_t>(i)].parts, 100 + i).ok());
  }
  // Let the server take what it will.
  const absl::Time settle = absl::Now() + absl::Seconds(1);
  int sent = 0;
  while (absl::Now() < settle) {
    auto c = cq->Wait(absl::Milliseconds(50));
    if (c.ok() && c->status.ok()) ++sent;
  }
  INFO("sends completed: " << sent << " of " << kRequests);
  CHECK(impl.Held() == kWindow);
  auto conns = (*server)->Connections();
  REQUIRE(conns.size() == 1);
  CHECK(conns[0].active_calls == kWindow);
  // The server stopped reading: the hostile client's own sends stalled.
  CHECK(sent < kRequests);

  // The client goes away and the held calls are answered: the server takes at most another
  // window from what the transport still held, never the whole backlog. The tcp backend fails
  // the paused connection when the client's reset arrives (tests/transport/held_memory_test.cpp,
  // "paused at the cap"); the server learns it from a refused post (ServerCallImpl::Finish) or an
  // error completion, and drops the connection: it leaves Connections() without a Shutdown.
  (*conn)->Close();
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    for (auto& call : impl.held) call.Finish(absl::OkStatus());
  }
  const absl::Time gone_by = absl::Now() + absl::Seconds(3);
  while (!(*server)->Connections().empty() && absl::Now() < gone_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK((*server)->Connections().empty());
  CHECK(impl.Held() <= 2 * kWindow);
  (*server)->Shutdown();
}
