// plexus::tooling: the rank launcher (over /bin/sh ranks), the command-line conventions and the
// JSON figure lines.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/tooling/launch.hpp"
#include "plexus/tooling/table.hpp"

namespace pt = plexus::tooling;

namespace {

pt::LaunchOptions Shell(int ranks, const std::string& script) {
  pt::LaunchOptions o;
  o.ranks = ranks;
  o.argv = {"/bin/sh", "-c", script};
  o.output = pt::OutputMode::kCaptured;
  o.grace = absl::Milliseconds(500);
  return o;
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

}  // namespace

TEST_CASE("launcher: every rank gets the rendezvous environment and its output is captured",
          "[tooling][launch]") {
  auto result =
      pt::Launch(Shell(3,
                       "echo \"rank=$PLEXUS_RANK of $PLEXUS_WORLD_SIZE local=$PLEXUS_LOCAL_RANK/"
                       "$PLEXUS_LOCAL_WORLD_SIZE store=$PLEXUS_STORE_ADDR\"; echo oops >&2"));
  REQUIRE(result.ok());
  CHECK(result->exit_code == 0);
  REQUIRE(result->ranks.size() == 3);
  CHECK(result->store_addr.rfind("127.0.0.1:", 0) == 0);
  for (int r = 0; r < 3; ++r) {
    const pt::RankResult& rank = result->ranks[r];
    CHECK(rank.exit_code == 0);
    CHECK(rank.out == "rank=" + std::to_string(r) + " of 3 local=" + std::to_string(r) +
                          "/3 store=" + result->store_addr + "\n");
    CHECK(rank.err == "oops\n");
    CHECK_FALSE(rank.stopped_by_launcher);
  }
}

TEST_CASE("launcher: per-rank argv and env, and the line callback", "[tooling][launch]") {
  pt::LaunchOptions o = Shell(2, "");
  o.rank_argv = [](int r) {
    return std::vector<std::string>{"/bin/sh", "-c", "echo arg" + std::to_string(r) + " $X"};
  };
  o.rank_env = [](int r) {
    return std::vector<std::pair<std::string, std::string>>{{"X", "env" + std::to_string(r)}};
  };
  o.plexus_env = false;
  std::vector<std::string> lines;
  o.on_line = [&](pt::Launcher&, int rank, pt::Stream stream, std::string_view line) {
    if (stream == pt::Stream::kStdout)
      lines.push_back(std::to_string(rank) + ":" + std::string(line));
  };
  auto result = pt::Launch(o);
  REQUIRE(result.ok());
  CHECK(result->ranks[0].out == "arg0 env0\n");
  CHECK(result->ranks[1].out == "arg1 env1\n");
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"0:arg0 env0", "1:arg1 env1"});
}

TEST_CASE("launcher: a killed rank is reported and the others are stopped", "[tooling][launch]") {
  const auto start = std::chrono::steady_clock::now();
  auto result = pt::Launch(Shell(3, "if [ $PLEXUS_RANK = 1 ]; then kill -9 $$; fi; sleep 30"));
  REQUIRE(result.ok());
  CHECK(Since(start) < 10);
  CHECK(result->first_failure == 1);
  CHECK(result->exit_code == 128 + SIGKILL);
  CHECK(result->ranks[1].signal == SIGKILL);
  CHECK_FALSE(result->ranks[1].stopped_by_launcher);
  CHECK(result->ranks[1].Describe() == "was killed by signal 9 (Killed)");
  for (int r : {0, 2}) {
    CHECK(result->ranks[r].stopped_by_launcher);
    CHECK(result->ranks[r].signal == SIGTERM);
  }
}

TEST_CASE("launcher: the first failing exit code wins; others keep running when asked",
          "[tooling][launch]") {
  pt::LaunchOptions o = Shell(2, "if [ $PLEXUS_RANK = 0 ]; then exit 3; fi; sleep 0.3; exit 0");
  o.stop_on_failure = false;
  auto result = pt::Launch(o);
  REQUIRE(result.ok());
  CHECK(result->exit_code == 3);
  CHECK(result->first_failure == 0);
  CHECK(result->ranks[1].exit_code == 0);
  CHECK_FALSE(result->ranks[1].stopped_by_launcher);
}

TEST_CASE("launcher: the timeout stops every rank, SIGKILL after the grace period",
          "[tooling][launch]") {
  // Rank 0 ignores SIGTERM, so only the SIGKILL after the grace period ends it.
  pt::LaunchOptions o =
      Shell(2,
            "trap '' TERM; if [ $PLEXUS_RANK = 0 ]; then while :; do sleep 0.05; done; fi; "
            "sleep 30");
  o.timeout = absl::Milliseconds(500);
  o.grace = absl::Milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  auto result = pt::Launch(o);
  REQUIRE(result.ok());
  const double seconds = Since(start);
  CHECK(seconds >= 0.5);
  CHECK(seconds < 0.8 * 1.25 + 0.5 + 1.0);  // timeout + grace, slack for a loaded machine
  CHECK(result->timed_out);
  CHECK(result->exit_code == pt::kTimeoutExitCode);
  CHECK(result->ranks[0].signal == SIGKILL);
  CHECK(result->ranks[0].stopped_by_launcher);
  CHECK(result->ranks[1].stopped_by_launcher);
}

TEST_CASE(
    "launcher: pids are exposed, a stopped rank can be signalled, and only our own "
    "processes are touched",
    "[tooling][launch]") {
  // A bystander child of this process that the launcher must neither reap nor signal.
  const pid_t bystander = fork();
  REQUIRE(bystander >= 0);
  if (bystander == 0) {
    sleep(30);
    _exit(0);
  }
  pt::LaunchOptions o = Shell(2, "echo ready; sleep 30");
  std::vector<pid_t> started;
  o.on_start = [&](pt::Launcher&, int, pid_t pid) { started.push_back(pid); };
  o.on_line = [](pt::Launcher& launcher, int rank, pt::Stream, std::string_view line) {
    if (line != "ready") return;
    if (rank == 0) {
      REQUIRE(launcher.Signal(0, SIGSTOP));
      REQUIRE(launcher.Signal(0, SIGKILL));
    }
  };
  o.timeout = absl::Seconds(20);
  pt::Launcher launcher(o);
  REQUIRE(launcher.Start().ok());
  CHECK(launcher.pids() == started);
  REQUIRE(started.size() == 2);
  const pt::LaunchResult result = launcher.Wait();
  CHECK(result.ranks[0].signal == SIGKILL);
  CHECK(result.ranks[0].pid == started[0]);
  CHECK(result.ranks[1].stopped_by_launcher);
  CHECK_FALSE(launcher.Signal(1, SIGKILL));  // already reaped
  CHECK(Alive(bystander));
  int status = 0;
  CHECK(waitpid(bystander, &status, WNOHANG) == 0);  // still ours to reap
  kill(bystander, SIGKILL);
  CHECK(waitpid(bystander, &status, 0) == bystander);
  CHECK(WIFSIGNALED(status));
}

TEST_CASE("launcher: a program that cannot be executed is an error naming it",
          "[tooling][launch]") {
  pt::LaunchOptions o;
  o.ranks = 2;
  o.argv = {"/nonexistent/plexus-program"};
  o.output = pt::OutputMode::kCaptured;
  auto result = pt::Launch(o);
  REQUIRE_FALSE(result.ok());
  CHECK(std::string(result.status().message()) ==
        "rank 0: cannot execute '/nonexistent/plexus-program': No such file or directory");
}

TEST_CASE("cli: strict numbers name the flag and the limit", "[tooling][cli]") {
  CHECK(*pt::ParseInteger("--runs", "12", 1, 100) == 12);
  CHECK(pt::ParseInteger("--runs", "abc", 1, 100).status().message() ==
        "--runs expects an integer in 1..100, got 'abc'");
  CHECK(pt::ParseInteger("--runs", "12x", 1, 100).status().message() ==
        "--runs expects an integer in 1..100, got '12x'");
  CHECK(pt::ParseInteger("--runs", "", 1, 100).status().message() ==
        "--runs expects an integer in 1..100, got ''");
  CHECK(pt::ParseInteger("--runs", "101", 1, 100).status().message() ==
        "--runs is out of range: expects an integer in 1..100, got 101");
  // A number in another notation is out of range, not "no integer".
  CHECK(pt::ParseInteger("--nodes", "1e18", 1, 1000000).status().message() ==
        "--nodes is out of range: expects an integer in 1..1000000, got 1e18");
  CHECK(pt::ParseInteger("--nodes", "1e18", 1, 1000000).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(pt::ParseUnsigned("--requests", "1e30", 1, 100).status().message() ==
        "--requests is out of range: expects an integer in 1..100, got 1e30");
  CHECK(pt::ParseInteger("--nodes", "2.5", 1, 100).status().message() ==
        "--nodes expects an integer in 1..100, got '2.5'");
  CHECK(pt::ParseInteger("--runs", "99999999999999999999", 1, 100).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(pt::ParseUnsigned("--bytes", "-1", 0, 10).status().message() ==
        "--bytes expects an integer in 0..10, got '-1'");
  CHECK(*pt::ParseReal("--timeout", "2.5", 0, 10) == 2.5);
  CHECK(pt::ParseReal("--timeout", "nan", 0, 10).status().message() ==
        "--timeout expects a number in 0..10, got 'nan'");
  CHECK(pt::ParseReal("--timeout", "1e308", 0, 1e9).status().message() ==
        "--timeout is out of range: expects a number in 0..1e+09, got 1e308");
}

TEST_CASE("cli: usage errors exit 2, --help and --version exit 0", "[tooling][cli]") {
  auto parse = [](std::vector<std::string> args, int* runs) {
    pt::Tool tool("plexus-test", "a test tool");
    tool.app().require_subcommand(1);
    CLI::App* sub = tool.Subcommand("go", "does it");
    pt::AddNumber(sub, "-r,--runs", runs, "runs", 1, 100);
    bool json = false;
    pt::AddJsonFlag(sub, &json);
    std::vector<char*> argv = {const_cast<char*>("plexus-test")};
    for (std::string& a : args) argv.push_back(a.data());
    return tool.Parse(static_cast<int>(argv.size()), argv.data());
  };
  int runs = 5;
  CHECK(parse({"go", "--runs", "7"}, &runs) == std::nullopt);
  CHECK(runs == 7);
  CHECK(parse({"go", "--runs", "x"}, &runs) == pt::kExitUsage);
  CHECK(runs == 7);
  CHECK(parse({"go", "--runs", "0"}, &runs) == pt::kExitUsage);
  CHECK(parse({"go", "--bogus"}, &runs) == pt::kExitUsage);
  CHECK(parse({}, &runs) == pt::kExitUsage);
  CHECK(parse({"go", "--help"}, &runs) == pt::kExitOk);
  CHECK(parse({"--help"}, &runs) == pt::kExitOk);
  CHECK(parse({"--version"}, &runs) == pt::kExitOk);
}

TEST_CASE("figures: one JSON object per line with the required keys", "[tooling][figures]") {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&buffer, &size);
  REQUIRE(out != nullptr);
  {
    pt::FigureWriter writer("transport", true, out);
    writer.Add({"bandwidth", 3.5, "GB/s", nlohmann::json(), std::nullopt, {{"bytes", 65536}}});
    writer.Add({"recovery", 0.7, "fraction", 0.7, true, {{"figure", "ignored"}}});
    writer.Add({"gap", std::nan(""), "ratio", "<= 1%", false, nlohmann::json::object()});
    CHECK_FALSE(writer.all_met());
  }
  std::fclose(out);
  const std::string text(buffer, size);
  free(buffer);
  std::vector<nlohmann::json> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(nlohmann::json::parse(text.substr(start, nl - start)));
  }
  CHECK(start == text.size());
  REQUIRE(lines.size() == 3);
  for (const auto& j : lines) {
    CHECK(j["bench"] == "transport");
    for (const char* key : {"figure", "value", "unit"}) CHECK(j.contains(key));
  }
  CHECK(lines[0] == nlohmann::json{{"bench", "transport"},
                                   {"figure", "bandwidth"},
                                   {"value", 3.5},
                                   {"unit", "GB/s"},
                                   {"bytes", 65536}});
  CHECK(lines[1]["figure"] == "recovery");
  CHECK(lines[1]["target"] == 0.7);
  CHECK(lines[1]["met"] == true);
  CHECK(lines[2]["value"].is_null());
  CHECK(lines[2]["met"] == false);
}

TEST_CASE("figures: the table mode prints one row per figure", "[tooling][figures]") {
  pt::FigureWriter writer("moe", false);
  writer.Add({"recovery", 0.75, "fraction", 0.7, true, {{"np", 4}}});
  CHECK(writer.Table() ==
        "moe\n"
        "  figure    value  unit      target  met\n"
        "  recovery   0.75  fraction  0.7     yes  np=4\n");
}

TEST_CASE("figures: common fields are in every JSON line and once in the table's title",
          "[tooling][figures]") {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&buffer, &size);
  REQUIRE(out != nullptr);
  pt::FigureWriter json("qos", true, out);
  json.SetCommon({{"link", "tcp loopback"}, {"iters", 2}});
  json.Add({"a_s", 0.5, "s", nullptr, std::nullopt, {{"run", 0}}});
  json.Add({"b_s", 0.25, "s", nullptr, std::nullopt, {{"iters", 3}}});
  std::fclose(out);
  const std::string text(buffer, size);
  free(buffer);
  const size_t nl = text.find('\n');
  REQUIRE(nl != std::string::npos);
  CHECK(nlohmann::json::parse(text.substr(0, nl)) == nlohmann::json{{"bench", "qos"},
                                                                    {"figure", "a_s"},
                                                                    {"value", 0.5},
                                                                    {"unit", "s"},
                                                                    {"run", 0},
                                                                    {"link", "tcp loopback"},
                                                                    {"iters", 2}});
  CHECK(nlohmann::json::parse(text.substr(nl + 1))["iters"] == 3);  // the figure's own wins

  pt::FigureWriter table("qos", false);
  table.SetCommon({{"link", "tcp loopback"}, {"iters", 2}});
  table.Add({"a_s", 0.5, "s", nullptr, std::nullopt, {{"run", 0}}});
  CHECK(table.Table() ==
        "qos (iters 2, link tcp loopback)\n"
        "  figure  value  unit  target  met\n"
        "  a_s       0.5  s                  run=0\n");
}

TEST_CASE("table: aligned columns, numbers to the right, no trailing spaces", "[tooling][table]") {
  CHECK(pt::FormatTable({"policy", "load", "p99 us"},
                        {{"random", "0.50", "251.3"}, {"daronpon", "0.8", "84.6"}, {"jsq"}},
                        {.right_aligned = {false, true, true}}) ==
        "policy    load  p99 us\n"
        "random    0.50   251.3\n"
        "daronpon   0.8    84.6\n"
        "jsq\n");
  CHECK(pt::FormatTable({"a", "b"}, {{"x", "y", "extra"}}, {.indent = "  "}) ==
        "  a  b\n"
        "  x  y  extra\n");
}

TEST_CASE("figures: a worker's line reads back as the same figure", "[tooling][figures]") {
  const pt::Figure f{"allreduce_time", 1.25, "ms", "<= 2", true, {{"np", 2}, {"variant", "f32"}}};
  const std::optional<pt::Figure> back = pt::FigureFromJsonLine(pt::FigureJson("cast", f).dump());
  REQUIRE(back.has_value());
  CHECK(back->figure == "allreduce_time");
  CHECK(back->value == 1.25);
  CHECK(back->unit == "ms");
  CHECK(back->target == "<= 2");
  CHECK(back->met == std::optional<bool>(true));
  CHECK(back->extra == f.extra);
  // Lines that are not figures: progress text, bad JSON, an array, a value that is not a number.
  for (const char* line : {"", "rank 0 ready", "{\"value\":", "[1,2]", "{\"figure\":\"x\"}",
                           "{\"figure\":\"x\",\"value\":null}"}) {
    INFO(line);
    CHECK_FALSE(pt::FigureFromJsonLine(line).has_value());
  }
}

TEST_CASE("launcher: SelfPath names this test program", "[tooling][launch]") {
  const std::string self = pt::SelfPath("fallback");
  CHECK(self.front() == '/');
  CHECK(self.find("tooling") != std::string::npos);
}

TEST_CASE("launcher: RunWorkers relays rank 0's figures and names a failure",
          "[tooling][launch][figures]") {
  pt::FigureWriter writer("w", false);
  absl::Status s = pt::RunWorkers(
      Shell(2,
            "echo '{\"figure\":\"t\",\"value\":'$PLEXUS_RANK',\"unit\":\"us\",\"np\":2}'; "
            "echo progress"),
      writer, "shm");
  CHECK(s.ok());
  REQUIRE(writer.figures().size() == 1);  // rank 1's line is not a figure of the run
  CHECK(writer.figures()[0].figure == "t");
  CHECK(writer.figures()[0].value == 0);
  CHECK(writer.figures()[0].extra["np"] == 2);
  s = pt::RunWorkers(Shell(2, "exit 3"), writer, "tcp");
  CHECK_FALSE(s.ok());
  CHECK(std::string(s.message()).find("tcp: the ranks failed (exit 3") != std::string::npos);
}
