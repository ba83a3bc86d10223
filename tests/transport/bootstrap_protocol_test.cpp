// The TcpStore frame decoder: round trips, and rejection of every malformed input.
#include <catch2/catch.hpp>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "bootstrap/store_state.hpp"
#include "plexus/base/byte_order.hpp"
#include "plexus/transport/store.hpp"

namespace proto = plexus::transport::store_protocol;
namespace pt = plexus::transport;

namespace {

absl::Span<const uint8_t> Bytes(const std::string& s, size_t offset = 0) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()) + offset,
                             s.size() - offset);
}

absl::Span<const uint8_t> Body(const std::string& frame) {
  return Bytes(frame, proto::kHeaderBytes);
}

std::string Header(uint32_t magic, uint32_t length) {
  std::string h;
  plexus::base::AppendLittleEndian(h, magic);
  plexus::base::AppendLittleEndian(h, length);
  return h;
}

std::vector<proto::Request> SampleRequests() {
  std::vector<proto::Request> out;
  proto::Request r;
  r.op = proto::Op::kHello;
  r.version = 7;
  out.push_back(r);
  r.job = "slurm-1234.0";
  out.push_back(r);
  r = {};
  r.op = proto::Op::kSet;
  r.keys = {"a/key"};
  r.value = std::string("bin\0ary", 7);
  out.push_back(r);
  r = {};
  r.op = proto::Op::kGet;
  r.keys = {"k"};
  r.timeout_ms = proto::kNoTimeout;
  out.push_back(r);
  r = {};
  r.op = proto::Op::kAdd;
  r.keys = {"counter"};
  r.delta = -42;
  out.push_back(r);
  r = {};
  r.op = proto::Op::kWait;
  r.keys = {"x", "yy", "zzz"};
  r.timeout_ms = 1500;
  out.push_back(r);
  r = {};
  r.op = proto::Op::kCheck;
  r.keys = {};
  out.push_back(r);
  r = {};
  r.op = proto::Op::kDelete;
  r.keys = {"gone"};
  out.push_back(r);
  return out;
}

}  // namespace

TEST_CASE("requests round-trip through encode and decode") {
  for (const proto::Request& r : SampleRequests()) {
    const std::string frame = proto::EncodeRequest(r);
    auto size = proto::PeekFrame(Bytes(frame));
    REQUIRE(size.ok());
    REQUIRE(*size == frame.size());
    auto decoded = proto::DecodeRequest(Body(frame));
    REQUIRE(decoded.ok());
    CHECK(decoded->op == r.op);
    CHECK(decoded->keys == r.keys);
    CHECK(decoded->value == r.value);
    CHECK(decoded->delta == r.delta);
    CHECK(decoded->timeout_ms == r.timeout_ms);
    if (r.op == proto::Op::kHello) CHECK(decoded->version == r.version);
    CHECK(decoded->job == r.job);
  }
}

TEST_CASE("frames are little-endian on the wire, whatever the host's byte order") {
  proto::Request r;
  r.op = proto::Op::kAdd;
  r.keys = {"k"};
  r.delta = 0x0102030405060708;
  const std::string frame = proto::EncodeRequest(r);
  // "PXST", body length 14, op 4, delta least significant byte first, key length 1, key.
  const std::string expected(
      "PXST\x0e\x00\x00\x00\x04\x08\x07\x06\x05\x04\x03\x02\x01"
      "\x01\x00\x00\x00k",
      22);
  CHECK(frame == expected);
}

TEST_CASE("a version-1 hello (no job field) decodes, so the server can answer its version") {
  std::string body(1, static_cast<char>(proto::Op::kHello));
  plexus::base::AppendLittleEndian<uint32_t>(body, 1);
  auto decoded = proto::DecodeRequest(Bytes(body));
  REQUIRE(decoded.ok());
  CHECK(decoded->version == 1);
  CHECK(decoded->job.empty());
  // From version 2 on the job field is required.
  plexus::base::StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(body.data()) + 1, 2);
  CHECK_FALSE(proto::DecodeRequest(Bytes(body)).ok());
}

TEST_CASE("responses round-trip through encode and decode") {
  proto::Response get;
  get.op = proto::Op::kGet;
  get.value = std::string(1000, 'v');
  proto::Response add;
  add.op = proto::Op::kAdd;
  add.number = -7;
  proto::Response check;
  check.op = proto::Op::kCheck;
  check.flag = true;
  proto::Response timeout;
  timeout.op = proto::Op::kWait;
  timeout.code = proto::Code::kTimeout;
  timeout.value = "missing key 'a'";
  proto::Response hello;
  hello.op = proto::Op::kHello;
  hello.number = proto::kVersion;
  hello.job = "job-A";
  hello.flag = true;
  proto::Response refused;
  refused.op = proto::Op::kHello;
  refused.code = proto::Code::kRefused;
  refused.value = "another job";
  proto::Response busy;
  busy.op = proto::Op::kHello;
  busy.code = proto::Code::kBusy;
  busy.value = "full";
  for (const proto::Response& r : {get, add, check, timeout, hello, refused, busy}) {
    const std::string frame = proto::EncodeResponse(r);
    auto decoded = proto::DecodeResponse(Body(frame));
    REQUIRE(decoded.ok());
    CHECK(decoded->op == r.op);
    CHECK(decoded->code == r.code);
    CHECK(decoded->value == r.value);
    CHECK(decoded->number == r.number);
    CHECK(decoded->flag == r.flag);
    CHECK(decoded->job == r.job);
  }
}

TEST_CASE("every truncation and every extension of a valid body is rejected") {
  for (const proto::Request& r : SampleRequests()) {
    const std::string frame = proto::EncodeRequest(r);
    const std::string body = frame.substr(proto::kHeaderBytes);
    for (size_t len = 0; len < body.size(); ++len) {
      INFO("op " << proto::OpName(r.op) << " truncated to " << len);
      CHECK_FALSE(proto::DecodeRequest(Bytes(body.substr(0, len))).ok());
    }
    auto extended = proto::DecodeRequest(Bytes(body + "x"));
    REQUIRE_FALSE(extended.ok());
    CHECK(std::string(extended.status().message()).find("trailing") != std::string::npos);
  }
}

TEST_CASE("frame headers: partial, bad magic and oversized lengths") {
  const std::string frame = proto::EncodeRequest(SampleRequests()[1]);
  for (size_t len = 0; len < proto::kHeaderBytes; ++len) {
    auto size = proto::PeekFrame(Bytes(frame.substr(0, len)));
    REQUIRE(size.ok());
    CHECK(*size == 0);  // needs more bytes
  }
  CHECK_FALSE(proto::PeekFrame(Bytes(std::string("GET / HTTP/1.1\r\n"))).ok());
  CHECK_FALSE(proto::PeekFrame(Bytes(std::string("G"))).ok());  // rejected at the first byte
  auto huge = proto::PeekFrame(Bytes(Header(proto::kMagic, 0xFFFFFFFFu)));
  REQUIRE_FALSE(huge.ok());
  CHECK(std::string(huge.status().message()).find("exceeds the limit") != std::string::npos);
  auto at_limit = proto::PeekFrame(Bytes(Header(proto::kMagic, proto::kMaxBodyBytes)));
  REQUIRE(at_limit.ok());
  CHECK(*at_limit == proto::kHeaderBytes + proto::kMaxBodyBytes);
  CHECK_FALSE(proto::PeekFrame(Bytes(Header(proto::kMagic, 100)), 99).ok());
}

TEST_CASE("lying counts and lengths are rejected before any allocation") {
  // A Check claiming 4 billion keys in a 9-byte body.
  std::string body;
  body.push_back(static_cast<char>(proto::Op::kCheck));
  const uint32_t count = 0xFFFFFFFFu;
  body.append(reinterpret_cast<const char*>(&count), 4);
  body.append("abcd");
  auto r = proto::DecodeRequest(Bytes(body));
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("key count") != std::string::npos);

  // A Set whose key claims more bytes than the key limit.
  body.clear();
  body.push_back(static_cast<char>(proto::Op::kSet));
  const uint32_t key_len = plexus::transport::kMaxStoreKeyBytes + 1;
  body.append(reinterpret_cast<const char*>(&key_len), 4);
  body.append(std::string(key_len, 'k'));
  body.append(std::string(4, '\0'));
  CHECK_FALSE(proto::DecodeRequest(Bytes(body)).ok());

  // Empty keys, unknown ops, unknown response codes, non-boolean flags.
  proto::Request empty_key;
  empty_key.op = proto::Op::kDelete;
  empty_key.keys = {""};
  CHECK_FALSE(proto::DecodeRequest(Body(proto::EncodeRequest(empty_key))).ok());
  CHECK_FALSE(proto::DecodeRequest(Bytes(std::string("\x63", 1))).ok());
  CHECK_FALSE(proto::DecodeRequest(Bytes(std::string())).ok());
  CHECK_FALSE(proto::DecodeResponse(Bytes(std::string("\x02\x09", 2))).ok());
  CHECK_FALSE(proto::DecodeResponse(Bytes(std::string("\x06\x00\x05", 3))).ok());
}

TEST_CASE("random and mutated bodies never crash the decoders") {
  std::mt19937 rng(12345);
  std::vector<std::string> seeds;
  for (const proto::Request& r : SampleRequests()) {
    seeds.push_back(proto::EncodeRequest(r).substr(proto::kHeaderBytes));
  }
  size_t accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string body = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !body.empty(); ++m) {
      switch (rng() % 3) {
        case 0:
          body[rng() % body.size()] = static_cast<char>(rng());
          break;
        case 1:
          body.resize(rng() % (body.size() + 1));
          break;
        default:
          body.insert(rng() % (body.size() + 1), 1, static_cast<char>(rng()));
      }
    }
    auto req = proto::DecodeRequest(Bytes(body));
    auto resp = proto::DecodeResponse(Bytes(body));
    if (req.ok()) {
      ++accepted;
      // Whatever is accepted must re-encode to the same bytes: the decoder is exact.
      CHECK(proto::EncodeRequest(*req).substr(proto::kHeaderBytes) == body);
    }
    (void)resp;
  }
  CHECK(accepted > 0);  // mutations of valid frames sometimes stay valid
}

// The store's request semantics without sockets (StoreState): what the server's thread does with
// each decoded request.
namespace {
proto::Request Req(proto::Op op, std::vector<std::string> keys, std::string value = "",
                   uint64_t timeout_ms = proto::kNoTimeout) {
  proto::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.value = std::move(value);
  r.timeout_ms = timeout_ms;
  return r;
}
}  // namespace

TEST_CASE("store state: a parked Get completes when its key is set, once", "[store_state]") {
  proto::StoreState state("", false, "127.0.0.1:1");
  const absl::Time t0 = absl::UnixEpoch();
  auto get = state.Handle(7, Req(proto::Op::kGet, {"k"}), t0);
  CHECK_FALSE(get.reply.has_value());
  CHECK(state.parked(7));
  CHECK(state.TakeCompleted().empty());
  auto set = state.Handle(8, Req(proto::Op::kSet, {"k"}, "v"), t0);
  REQUIRE(set.reply.has_value());
  CHECK(set.reply->code == proto::Code::kOk);
  auto done = state.TakeCompleted();
  REQUIRE(done.size() == 1);
  CHECK(done[0].first == 7);
  CHECK(done[0].second.value == "v");
  CHECK_FALSE(state.parked(7));
  CHECK(state.TakeCompleted().empty());
}

TEST_CASE("store state: a parked Wait times out at its deadline naming the missing keys",
          "[store_state]") {
  proto::StoreState state("", false, "127.0.0.1:1");
  const absl::Time t0 = absl::UnixEpoch();
  state.Handle(3, Req(proto::Op::kSet, {"a"}, "1"), t0);
  auto wait = state.Handle(4, Req(proto::Op::kWait, {"a", "b", "c"}, "", 500), t0);
  CHECK_FALSE(wait.reply.has_value());
  CHECK(state.next_deadline() == t0 + absl::Milliseconds(500));
  CHECK(state.Expire(t0 + absl::Milliseconds(499)).empty());
  auto expired = state.Expire(t0 + absl::Milliseconds(500));
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].first == 4);
  CHECK(expired[0].second.code == proto::Code::kTimeout);
  CHECK(expired[0].second.value == "missing keys 'b', 'c'");
  CHECK(state.next_deadline() == absl::InfiniteFuture());
}

TEST_CASE("store state: a forgotten client's parked request is dropped", "[store_state]") {
  proto::StoreState state("", false, "127.0.0.1:1");
  state.Handle(5, Req(proto::Op::kGet, {"k"}), absl::UnixEpoch());
  state.Forget(5);
  state.Handle(6, Req(proto::Op::kSet, {"k"}, "v"), absl::UnixEpoch());
  CHECK(state.TakeCompleted().empty());
}

TEST_CASE("store state: counters add, refuse non-counters and overflow", "[store_state]") {
  proto::StoreState state("", false, "127.0.0.1:1");
  proto::Request add = Req(proto::Op::kAdd, {"n"});
  add.delta = 5;
  CHECK(state.Handle(1, add, absl::UnixEpoch()).reply->number == 5);
  add.delta = std::numeric_limits<int64_t>::max();
  CHECK(state.Handle(1, add, absl::UnixEpoch()).reply->code == proto::Code::kInvalid);
  state.Handle(1, Req(proto::Op::kSet, {"s"}, "text"), absl::UnixEpoch());
  add.keys = {"s"};
  add.delta = 1;
  auto r = state.Handle(1, add, absl::UnixEpoch());
  CHECK(r.reply->code == proto::Code::kInvalid);
  CHECK(r.reply->value == "key 's' holds a value that is not a counter");
}

TEST_CASE("store state: a hello of another job is refused without learning the served job",
          "[store_state]") {
  proto::StoreState state("job-a", false, "127.0.0.1:29500");
  proto::Request hello = Req(proto::Op::kHello, {});
  hello.version = proto::kVersion;
  hello.job = "job-b";
  auto refused = state.Handle(1, hello, absl::UnixEpoch());
  CHECK_FALSE(refused.hello_accepted);
  REQUIRE(refused.reply.has_value());
  CHECK(refused.reply->code == proto::Code::kRefused);
  CHECK(refused.refusal.find("is job 'job-b'") != std::string::npos);
  CHECK(refused.refusal.find("127.0.0.1:29500") != std::string::npos);
  CHECK(refused.refusal.find("PLEXUS_JOB_ID") != std::string::npos);
  // Neither the message nor the reply's fields tell the client the job to name instead.
  CHECK(refused.refusal.find("job-a") == std::string::npos);
  CHECK(refused.reply->value.find("job-a") == std::string::npos);
  CHECK(refused.reply->job.empty());
  const std::string frame = proto::EncodeResponse(*refused.reply);
  CHECK(frame.find("job-a") == std::string::npos);
  hello.job = "";
  auto none = state.Handle(2, hello, absl::UnixEpoch());
  CHECK_FALSE(none.hello_accepted);
  CHECK(none.refusal.find("names no job id") != std::string::npos);
  CHECK(proto::EncodeResponse(*none.reply).find("job-a") == std::string::npos);
  hello.job = "job-a";
  auto accepted = state.Handle(3, hello, absl::UnixEpoch());
  CHECK(accepted.hello_accepted);
  CHECK(accepted.reply->job == "job-a");
  // A nonce job lets a client that names no job in (it learns the nonce from the reply), but not
  // a client that names another job.
  proto::StoreState nonce("n123", true, "127.0.0.1:29500");
  hello.job = "";
  auto learned = nonce.Handle(4, hello, absl::UnixEpoch());
  CHECK(learned.hello_accepted);
  CHECK(learned.reply->job == "n123");
  hello.job = "job-b";
  auto other = nonce.Handle(5, hello, absl::UnixEpoch());
  CHECK_FALSE(other.hello_accepted);
  CHECK(proto::EncodeResponse(*other.reply).find("n123") == std::string::npos);
  CHECK(other.refusal.find("n123") == std::string::npos);
}

TEST_CASE("store state: keys and values stay within the byte cap", "[store_state]") {
  constexpr uint64_t kOverhead = proto::StoreState::kEntryOverheadBytes;
  proto::StoreState state("", false, "127.0.0.1:29500", 1000);
  const std::string big(600, 'x');
  auto first = state.Handle(1, Req(proto::Op::kSet, {"a"}, big), absl::UnixEpoch());
  CHECK(first.reply->code == proto::Code::kOk);
  CHECK(state.bytes() == 1 + 600 + kOverhead);
  auto second = state.Handle(1, Req(proto::Op::kSet, {"b"}, big), absl::UnixEpoch());
  REQUIRE(second.reply->code == proto::Code::kFull);
  for (const char* word :
       {"key 'b'", "600 bytes", "cap of 1000", "127.0.0.1:29500", "PLEXUS_STORE_MAX_BYTES"}) {
    INFO(second.reply->value);
    CHECK(second.reply->value.find(word) != std::string::npos);
  }
  CHECK(state.bytes() == 1 + 600 + kOverhead);
  auto get = state.Handle(1, Req(proto::Op::kCheck, {"b"}), absl::UnixEpoch());
  CHECK_FALSE(get.reply->flag);  // nothing of the refused Set was kept
  // Replacing a value counts the difference; deleting gives the bytes back.
  CHECK(state.Handle(1, Req(proto::Op::kSet, {"a"}, std::string(1000, 'y')), absl::UnixEpoch())
            .reply->code == proto::Code::kFull);
  CHECK(state.Handle(1, Req(proto::Op::kSet, {"a"}, "small"), absl::UnixEpoch()).reply->code ==
        proto::Code::kOk);
  CHECK(state.bytes() == 1 + 5 + kOverhead);
  CHECK(state.Handle(1, Req(proto::Op::kSet, {"b"}, big), absl::UnixEpoch()).reply->code ==
        proto::Code::kOk);
  // A new counter takes room too.
  proto::StoreState tiny("", false, "127.0.0.1:29500", 10 + kOverhead);
  proto::Request add = Req(proto::Op::kAdd, {"counter-with-a-long-name"});
  add.delta = 1;
  auto refused = tiny.Handle(1, add, absl::UnixEpoch());
  CHECK(refused.reply->code == proto::Code::kFull);
  CHECK(tiny.bytes() == 0);
  REQUIRE(state.Handle(1, Req(proto::Op::kDelete, {"b"}), absl::UnixEpoch()).reply->flag);
  CHECK(state.bytes() == 1 + 5 + kOverhead);
  // The client reads a full store as ResourceExhausted (tcp_store.cpp): the code round-trips.
  const std::string full_frame = proto::EncodeResponse(*second.reply);
  auto decoded = proto::DecodeResponse(Bytes(full_frame, proto::kHeaderBytes));
  REQUIRE(decoded.ok());
  CHECK(decoded->code == proto::Code::kFull);
}

TEST_CASE("store state: a failure report under any prefix marks the job failed", "[store_state]") {
  proto::StoreState state("", false, "127.0.0.1:1");
  state.Handle(1, Req(proto::Op::kSet, {"plexus/job/j/rendezvous/world-size"}, "2"),
               absl::UnixEpoch());
  state.Handle(1, Req(proto::Op::kSet, {"plexus/job/j/not-plexus/failed/0"}, "x"),
               absl::UnixEpoch());
  CHECK_FALSE(state.job_failed());
  state.Handle(2, Req(proto::Op::kSet, {"plexus/job/j/plexus/failed/1"}, "rank 1: timeout"),
               absl::UnixEpoch());
  CHECK(state.job_failed());
  CHECK(state.failed_key() == "plexus/job/j/plexus/failed/1");
  CHECK(pt::IsJobFailureKey("plexus/failed/3"));
  CHECK_FALSE(pt::IsJobFailureKey("xplexus/failed/3"));
}
