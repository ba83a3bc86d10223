// TorchStore against torch's real TCPStore server (Debian's python3-torch 1.13, started here by
// /usr/bin/python3 on 127.0.0.1), and the rendezvous over it as torchrun's workers see it. Skips
// (77) when torch is not installed.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"
#include "support/skip.hpp"

namespace pt = plexus::transport;

namespace {

// torch's TCPStore server in a child python process; it prints its port, serves until killed,
// and exits by itself after two minutes or when this process is gone.
constexpr const char* kServerScript = R"(
import datetime, os, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=120),
                      wait_for_workers=False)
store.set("python-key", "from python")
print(store.port, flush=True)
parent = os.getppid()
for _ in range(1200):
    if os.getppid() != parent:
        break
    time.sleep(0.1)
)";

class TorchServer {
 public:
  TorchServer() {
    if (std::system("/usr/bin/python3 -c 'import torch.distributed' > /dev/null 2>&1") != 0) {
      plexus::testing::SkipTest("python3-torch is not installed (torch's TCPStore is the server)");
    }
    int out[2];
    REQUIRE(pipe(out) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      execl("/usr/bin/python3", "python3", "-c", kServerScript, static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    std::string line;
    pollfd p{out[0], POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      if (poll(&p, 1, 1000) <= 0) continue;
      char buf[64];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, n);
    }
    close(out[0]);
    int port = 0;
    REQUIRE(absl::SimpleAtoi(line.substr(0, line.find('\n')), &port));
    address_ = absl::StrCat("127.0.0.1:", port);
    port_ = port;
  }
  ~TorchServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
  int port_ = 0;
};

TorchServer& Server() {
  static TorchServer server;
  return server;
}

std::unique_ptr<pt::TorchStore> Connect() {
  auto store = pt::TorchStore::Connect(Server().address(), absl::Seconds(10), absl::Seconds(10));
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("every Store call against torch's TCPStore") {
  auto store = Connect();
  CHECK(store->description() == "torch store at " + Server().address());
  // torch's Python client prefixes its keys with "/"; ours go as given.
  auto from_python = store->Get("/python-key", absl::Seconds(5));
  REQUIRE(from_python.ok());
  CHECK(*from_python == "from python");

  const std::string binary("a\0b\xff", 4);
  REQUIRE(store->Set("t/bin", binary).ok());
  auto got = store->Get("t/bin", absl::Seconds(5));
  REQUIRE(got.ok());
  CHECK(*got == binary);
  REQUIRE(store->Set("t/bin", "replaced").ok());
  CHECK(*store->Get("t/bin", absl::Seconds(5)) == "replaced");
  REQUIRE(store->Set("t/empty", "").ok());
  CHECK(store->Get("t/empty", absl::Seconds(5))->empty());
  const std::string big(3 << 20, 'x');
  REQUIRE(store->Set("t/big", big).ok());
  CHECK(*store->Get("t/big", absl::Seconds(5)) == big);

  CHECK(*store->Add("t/count", 5) == 5);
  CHECK(*store->Add("t/count", -7) == -2);
  CHECK(*store->Add("t/count", 0) == -2);
  CHECK(*store->Get("t/count", absl::Seconds(5)) == "-2");  // counters are decimal text

  CHECK(*store->Check({"t/bin", "t/count"}) == true);
  CHECK(*store->Check({"t/bin", "t/absent"}) == false);
  CHECK(*store->Check({}) == true);
  REQUIRE(store->Wait({"t/bin", "t/count"}, absl::Seconds(5)).ok());

  CHECK(*store->Delete("t/count") == true);
  CHECK(*store->Delete("t/count") == false);
  CHECK(*store->Check({"t/count"}) == false);

  CHECK(absl::IsInvalidArgument(store->Set("", "v")));
  CHECK(absl::IsInvalidArgument(store->Get(std::string(5000, 'k'), absl::Seconds(1)).status()));
}

TEST_CASE("a parked Get is woken by another client's Set, and a Set meanwhile is not delayed") {
  auto waiter = Connect();
  auto setter = Connect();
  std::string seen;
  std::thread t([&] {
    auto v = waiter->Get("t/later", absl::Seconds(20));
    seen = v.ok() ? *v : v.status().ToString();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The same client as the parked Get: its other calls use another socket.
  REQUIRE(waiter->Set("t/unrelated", "1").ok());
  REQUIRE(setter->Set("t/later", "now").ok());
  t.join();
  CHECK(seen == "now");
}

TEST_CASE("timeouts name the missing keys, and the store stays usable after them") {
  auto store = Connect();
  REQUIRE(store->Set("t/present", "1").ok());
  auto start = std::chrono::steady_clock::now();
  auto get = store->Get("t/never", absl::Milliseconds(400));
  double took = SecondsSince(start);
  REQUIRE(absl::IsDeadlineExceeded(get.status()));
  CHECK(std::string(get.status().message()).find("key 't/never' was not set within 400ms") !=
        std::string::npos);
  CHECK(took >= 0.4);
  CHECK(took < 0.4 * 1.25 + 0.5);

  start = std::chrono::steady_clock::now();
  auto wait = store->Wait({"t/present", "t/never", "t/nor"}, absl::Milliseconds(300));
  took = SecondsSince(start);
  REQUIRE(absl::IsDeadlineExceeded(wait));
  CHECK(std::string(wait.message()).find("keys 't/never', 't/nor' were not set") !=
        std::string::npos);
  CHECK(took < 0.3 * 1.25 + 0.5);

  // The timed-out WAITs' sockets were closed: a late STOP_WAITING is never read as a reply.
  REQUIRE(store->Set("t/never", "late").ok());
  CHECK(*store->Check({"t/never"}) == true);
  CHECK(*store->Get("t/never", absl::Seconds(5)) == "late");
}

TEST_CASE("Add on a key that holds no counter is InvalidArgument, and the server serves on") {
  auto store = Connect();
  REQUIRE(store->Set("t/text", "not a number").ok());
  auto add = store->Add("t/text", 1);
  REQUIRE(absl::IsInvalidArgument(add.status()));
  CHECK(std::string(add.status().message()).find("not a decimal counter") != std::string::npos);
  CHECK(*store->Get("t/text", absl::Seconds(5)) == "not a number");
}

TEST_CASE("Connect refuses a server that does not speak torch's protocol") {
  auto plexus_server = pt::TcpStoreServer::Start("127.0.0.1:0");
  REQUIRE(plexus_server.ok());
  const auto start = std::chrono::steady_clock::now();
  auto store = pt::TorchStore::Connect(absl::StrCat("127.0.0.1:", (*plexus_server)->port()),
                                       absl::Seconds(3), absl::Seconds(1));
  CHECK(SecondsSince(start) < 3 * 1.25 + 0.5);
  REQUIRE(absl::IsFailedPrecondition(store.status()));
  CHECK(std::string(store.status().message()).find("does not answer torch 1.13's TCPStore") !=
        std::string::npos);
  CHECK(std::string(store.status().message()).find("PLEXUS_STORE_ADDR") != std::string::npos);
}

TEST_CASE("torchrun's workers meet in the agent's store: FromEnv, AllGather, Barrier") {
  constexpr int kRanks = 3;
  const std::string port = std::to_string(Server().port());
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      // What torchrun 1.13 exports to its workers (static rendezvous, the default).
      const pt::Environment env = {{"RANK", std::to_string(r)},
                                   {"WORLD_SIZE", std::to_string(kRanks)},
                                   {"LOCAL_RANK", std::to_string(r)},
                                   {"LOCAL_WORLD_SIZE", std::to_string(kRanks)},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", port},
                                   {"TORCHELASTIC_RUN_ID", "none"},
                                   {"TORCHELASTIC_RESTART_COUNT", "0"},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
      auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(20));
      if (!rdzv.ok()) {
        errors[r] = rdzv.status().ToString();
        return;
      }
      if (rdzv->store_server() != nullptr) errors[r] = "a worker started a store of its own";
      if (rdzv->job_id() != "torchrun:agent-store.restart-0") errors[r] = "job " + rdzv->job_id();
      auto all = rdzv->AllGather("v", absl::StrCat("r", r), absl::Seconds(20));
      if (!all.ok()) {
        errors[r] = all.status().ToString();
        return;
      }
      for (int p = 0; p < kRanks; ++p) {
        if ((*all)[p] != absl::StrCat("r", p)) errors[r] = "bad AllGather: " + (*all)[p];
      }
      if (absl::Status s = rdzv->Barrier("b", absl::Seconds(20)); !s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
  }
}
