#include <catch2/catch.hpp>

#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/memory.hpp"

namespace pt = plexus::transport;

TEST_CASE("backend names round-trip", "[transport]") {
  for (auto b : {pt::Backend::kInproc, pt::Backend::kShm, pt::Backend::kTcp, pt::Backend::kVerbs}) {
    auto parsed = pt::ParseBackend(pt::BackendName(b));
    REQUIRE(parsed.ok());
    CHECK(*parsed == b);
  }
  CHECK(pt::ParseBackend("TCP").ok());
  auto bad = pt::ParseBackend("carrier-pigeon");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("carrier-pigeon") != std::string::npos);
}

TEST_CASE("region handle encodes and rejects malformed input", "[transport]") {
  pt::RegionHandle h;
  h.id = 0x1122334455667788ull;
  h.address = 0xdeadbeef000ull;
  h.length = 12345;
  h.rkey = 77;
  h.backend = pt::Backend::kShm;
  h.kind = pt::MemoryKind::kHost;
  auto bytes = h.Encode();
  auto back = pt::RegionHandle::Decode(bytes);
  REQUIRE(back.ok());
  CHECK(back->id == h.id);
  CHECK(back->address == h.address);
  CHECK(back->length == h.length);
  CHECK(back->rkey == h.rkey);
  CHECK(back->backend == h.backend);

  CHECK_FALSE(pt::RegionHandle::Decode(absl::MakeSpan(bytes.data(), 10)).ok());
  auto corrupt = bytes;
  corrupt[0] ^= 0xff;
  CHECK_FALSE(pt::RegionHandle::Decode(corrupt).ok());
  corrupt = bytes;
  corrupt[5] = 42;  // backend
  CHECK_FALSE(pt::RegionHandle::Decode(corrupt).ok());
}

TEST_CASE("completion queue delivers in push order and times out", "[transport]") {
  pt::CompletionQueue cq;
  for (uint64_t i = 0; i < 5; ++i) {
    pt::Completion c;
    c.wr_id = i;
    cq.Push(c);
  }
  CHECK(cq.size() == 5);
  pt::Completion out[3];
  REQUIRE(cq.Poll(absl::MakeSpan(out)) == 3);
  CHECK(out[0].wr_id == 0);
  CHECK(out[2].wr_id == 2);
  auto next = cq.Wait(absl::Milliseconds(10));
  REQUIRE(next.ok());
  CHECK(next->wr_id == 3);
  REQUIRE(cq.Wait(absl::Milliseconds(10)).ok());
  auto none = cq.Wait(absl::Milliseconds(20));
  CHECK(absl::IsDeadlineExceeded(none.status()));
}

TEST_CASE("device options are validated", "[transport]") {
  pt::DeviceOptions options;
  options.tcp.sockets_per_connection = 0;
  CHECK(absl::IsInvalidArgument(pt::Device::Create(options).status()));
  std::string why;
  if (!pt::Device::Available(pt::Backend::kVerbs, &why)) CHECK_FALSE(why.empty());
}
