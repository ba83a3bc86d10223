// The generic admin endpoint (plexus/base/admin.hpp): the request decoder's errors name the field;
// a wrong token, a malformed or an oversized request gets an error reply and runs no handler;
// only loopback addresses are served; a silent client is dropped; replies round-trip codes.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "catch2/catch.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/admin.hpp"
#include "plexus/base/net.hpp"

namespace admin = plexus::base::admin;
namespace net = plexus::base::net;

namespace {

std::string Error(std::string_view body) {
  auto r = admin::DecodeRequest(body);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

}  // namespace

TEST_CASE("admin: the request decoder names what is wrong", "[base][admin]") {
  auto ok = admin::DecodeRequest(R"({"token":"t","command":"attach","args":{"name":"rl"}})");
  REQUIRE(ok.ok());
  CHECK(ok->token == "t");
  CHECK(ok->command == "attach");
  CHECK(ok->args == std::map<std::string, std::string>{{"name", "rl"}});
  auto again = admin::DecodeRequest(admin::EncodeRequest(*ok));
  REQUIRE(again.ok());
  CHECK(again->args == ok->args);

  CHECK(Error("") == "admin request: expected a JSON object {\"token\", \"command\", \"args\"}");
  CHECK(Error("[1]") == "admin request: expected a JSON object {\"token\", \"command\", \"args\"}");
  CHECK(Error(R"({"token":1,"command":"x"})") == "admin request: token: expected a string");
  CHECK(Error(R"({"token":"t"})") == "admin request: command: must have 1 to 64 characters");
  CHECK(Error(R"({"token":"t","command":"a b"})") ==
        "admin request: command: only letters, digits, '-' and '_' are allowed");
  CHECK(Error(R"({"token":"t","command":"x","args":{"k":1}})") ==
        "admin request: args.k: expected a string");
  CHECK(Error(R"({"token":"t","command":"x","args":[]})") ==
        "admin request: args: expected an object");
  CHECK(Error(R"({"token":"t","command":"x","extra":1})") ==
        "admin request: extra: unknown field (expected one of: token, command, args)");
  CHECK(Error(std::string(100000, '[')) == "admin request: JSON nested deeper than 4");
}

TEST_CASE("admin: token, dispatch and error replies", "[base][admin]") {
  auto s = admin::AdminServer::Start({.token = "s3cret"});
  REQUIRE(s.ok());
  std::atomic<int> runs{0};
  (*s)->Handle("echo", "returns args",
               [&](const admin::AdminRequest& r) -> absl::StatusOr<std::string> {
                 ++runs;
                 if (r.args.contains("fail")) return absl::FailedPreconditionError("asked to fail");
                 return nlohmann::json(r.args).dump();
               });
  const std::string addr = (*s)->address();
  CHECK(addr.rfind("127.0.0.1:", 0) == 0);

  auto good = admin::AdminCall(addr, {"s3cret", "echo", {{"a", "1"}}});
  REQUIRE(good.ok());
  CHECK(*good == R"({"a":"1"})");
  CHECK(runs == 1);

  auto wrong = admin::AdminCall(addr, {"guess", "echo", {}});
  CHECK(wrong.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(std::string(wrong.status().message()) ==
        "admin request: wrong or missing token (see the endpoint's token setting)");
  auto failed = admin::AdminCall(addr, {"s3cret", "echo", {{"fail", "1"}}});
  CHECK(failed.status() == absl::FailedPreconditionError("asked to fail"));
  auto unknown = admin::AdminCall(addr, {"s3cret", "nope", {}});
  CHECK(unknown.status() ==
        absl::NotFoundError("admin: unknown command 'nope' (commands: help, echo)"));
  auto help = admin::AdminCall(addr, {"s3cret", "help", {}});
  REQUIRE(help.ok());
  CHECK(*help == R"({"echo":"returns args"})");
  CHECK(runs == 2);  // the wrong token and the unknown command ran nothing

  CHECK(
      (*s)->Dispatch("{not json") ==
      R"({"code":"INVALID_ARGUMENT","error":"admin request: expected a JSON object {\"token\", \"command\", \"args\"}","ok":false})");
  (*s)->Remove("echo");
  CHECK(admin::AdminCall(addr, {"s3cret", "echo", {}}).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(runs == 2);
}

TEST_CASE("admin: oversized and silent clients are refused, bounded in time", "[base][admin]") {
  auto s = admin::AdminServer::Start(
      {.token = "t", .max_request_bytes = 1024, .request_timeout = absl::Milliseconds(300)});
  REQUIRE(s.ok());
  int runs = 0;
  (*s)->Handle("x", "", [&](const admin::AdminRequest&) -> absl::StatusOr<std::string> {
    ++runs;
    return std::string("{}");
  });
  auto sa = net::ResolveFirst((*s)->address(), "test");
  REQUIRE(sa.ok());
  bool retry = false;
  // A length prefix of 1 MiB: the reply refuses it without reading the body.
  {
    auto fd = net::ConnectTcp(*sa, absl::Now() + absl::Seconds(5), &retry);
    REQUIRE(fd.ok());
    const unsigned char len[4] = {0, 0x10, 0, 0};
    REQUIRE(net::SendAll(*fd, len, 4, absl::Now() + absl::Seconds(5)).ok());
    unsigned char rlen[4];
    REQUIRE(net::RecvAll(*fd, rlen, 4, absl::Now() + absl::Seconds(5)).ok());
    std::string body((rlen[2] << 8) | rlen[3], '\0');
    REQUIRE(net::RecvAll(*fd, body.data(), body.size(), absl::Now() + absl::Seconds(5)).ok());
    CHECK(
        body ==
        R"({"code":"INVALID_ARGUMENT","error":"admin request of 1048576 bytes is over the limit of 1024 bytes","ok":false})");
    ::close(*fd);
  }
  // A client that connects and sends nothing is dropped after the request timeout; the next one
  // is served.
  {
    auto fd = net::ConnectTcp(*sa, absl::Now() + absl::Seconds(5), &retry);
    REQUIRE(fd.ok());
    const absl::Time t0 = absl::Now();
    auto r = admin::AdminCall((*s)->address(), {"t", "x", {}}, absl::Seconds(10));
    CHECK(r.ok());
    CHECK(absl::Now() - t0 < absl::Milliseconds(300) * 1.25 + absl::Milliseconds(500));
    ::close(*fd);
  }
  CHECK(runs == 1);
}

TEST_CASE("admin: loopback only, and a token is required", "[base][admin]") {
  auto open = admin::AdminServer::Start({.address = "0.0.0.0:0", .token = "t"});
  CHECK(open.status() ==
        absl::InvalidArgumentError("admin endpoint address 0.0.0.0:0 is not a loopback address "
                                   "(it is served on 127.0.0.1 or ::1 only)"));
  auto no_token = admin::AdminServer::Start({});
  CHECK(no_token.status() ==
        absl::InvalidArgumentError("admin endpoint: a token is required (it is never open)"));
}

TEST_CASE("admin: CheckArgs names the command and the unknown argument", "[base][admin]") {
  admin::AdminRequest r;
  r.command = "coll-reconfigure";
  r.args = {{"name", "x"}, {"channels", "1"}};
  CHECK(admin::CheckArgs(r, {"name", "channels", "ring_order"}).ok());
  const absl::Status bad = admin::CheckArgs(r, {"name"});
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.message()) ==
        "admin command 'coll-reconfigure': unknown argument 'channels' (expected: name)");
  r.args.clear();
  CHECK(admin::CheckArgs(r, {}).ok());
}
