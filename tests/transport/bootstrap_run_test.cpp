// plexus-run: environment, prefixed output, exit statuses, and stopping the ranks on failure.
#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap_test_util.hpp"

using plexus::testing::RunShell;
using plexus::testing::ShellResult;

namespace {

// Every command carries --timeout, so that a broken plexus-run cannot hang the test.
ShellResult Run(const std::string& args) {
  return RunShell(std::string(PLEXUS_RUN) + " --timeout 60 " + args);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool Contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("plexus-run --help and bad usage") {
  auto help = RunShell(std::string(PLEXUS_RUN) + " --help");
  CHECK(help.exit_code == 0);
  CHECK(Has(help.out, "usage: plexus-run -n N"));
  auto no_n = RunShell(std::string(PLEXUS_RUN) + " /bin/true");
  CHECK(no_n.exit_code == 2);
  CHECK(Has(no_n.err, "missing -n N"));
  auto bad_n = RunShell(std::string(PLEXUS_RUN) + " -n zero /bin/true");
  CHECK(bad_n.exit_code == 2);
  CHECK(Has(bad_n.err, "-n expects an integer in 1..4096"));
  auto no_prog = RunShell(std::string(PLEXUS_RUN) + " -n 2");
  CHECK(no_prog.exit_code == 2);
  auto missing = RunShell(std::string(PLEXUS_RUN) + " -n 2 /nonexistent/program");
  CHECK(missing.exit_code == 127);
  CHECK(Has(missing.err, "cannot execute '/nonexistent/program'"));
}

TEST_CASE("plexus-run sets the rendezvous environment of every rank") {
  auto r =
      Run("-n 3 -- /bin/sh -c "
          "'echo $PLEXUS_RANK/$PLEXUS_WORLD_SIZE/$PLEXUS_LOCAL_RANK/"
          "$PLEXUS_LOCAL_WORLD_SIZE/$PLEXUS_STORE_ADDR'");
  CHECK(r.exit_code == 0);
  const auto lines = Lines(r.out);
  REQUIRE(lines.size() == 3);
  std::string addr;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[" + std::to_string(rank) + "] " + std::to_string(rank) + "/3/" +
                               std::to_string(rank) + "/3/127.0.0.1:";
    auto it = std::find_if(lines.begin(), lines.end(),
                           [&](const std::string& l) { return l.rfind(prefix, 0) == 0; });
    REQUIRE(it != lines.end());
    const std::string this_addr = it->substr(it->find("127.0.0.1:"));
    if (addr.empty()) addr = this_addr;
    CHECK(this_addr == addr);  // one store address for the job
  }
  CHECK(addr.size() > std::string("127.0.0.1:").size());
}

TEST_CASE("plexus-run prefixes every line of stdout and stderr with the rank") {
  auto r = Run("-n 2 " BOOTSTRAP_HELPER " echo");
  CHECK(r.exit_code == 0);
  const auto out = Lines(r.out);
  const auto err = Lines(r.err);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "] ";
    CHECK(Contains(out, p + "hello from rank " + std::to_string(rank)));
    CHECK(Contains(out, p + "second line of rank " + std::to_string(rank)));
    CHECK(Contains(out, p + "unterminated " + std::to_string(rank)));  // flushed at exit
    CHECK(Contains(err, p + "error line of rank " + std::to_string(rank)));
  }
  CHECK(out.size() == 6);  // no stray, unprefixed or split lines
  CHECK(Has(r.err, "plexus-run: all 2 ranks exited with code 0"));
}

TEST_CASE("plexus-run keeps lines whole when ranks print concurrently") {
  // 4 ranks each print 2000 long lines as fast as they can; every output line must be exactly
  // one line of one rank.
  auto r =
      Run("-n 4 -- /bin/sh -c 'i=0; while [ $i -lt 2000 ]; do "
          "echo \"rank=$PLEXUS_RANK line=$i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
          "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx end\"; i=$((i+1)); done'");
  CHECK(r.exit_code == 0);
  const auto lines = Lines(r.out);
  CHECK(lines.size() == 8000);
  size_t bad = 0;
  for (const std::string& l : lines) {
    const size_t close = l.find("] rank=");
    if (l.size() < 4 || l[0] != '[' || close == std::string::npos ||
        l.substr(1, close - 1) != l.substr(close + 7, l.find(' ', close + 2) - close - 7) ||
        l.substr(l.size() - 4) != " end") {
      ++bad;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("plexus-run exit status reports the failing rank") {
  auto ok = Run("-n 3 " BOOTSTRAP_HELPER " exit 1 0");
  CHECK(ok.exit_code == 0);
  auto failed = Run("-n 3 " BOOTSTRAP_HELPER " exit 1 7");
  CHECK(failed.exit_code == 7);
  CHECK(Has(failed.err, "rank 1 exited with code 7"));
  auto json = Run("--json -n 2 " BOOTSTRAP_HELPER " exit 0 5");
  CHECK(json.exit_code == 5);
  CHECK(Has(json.out, "\"exit_code\":5"));
  CHECK(Has(json.out, "\"first_failure\":0"));
}

TEST_CASE("plexus-run: one rank crashing stops the others quickly") {
  // Ranks 0 and 2 would sleep for 60 s; rank 1 aborts after 0.2 s.
  auto r = Run("-n 3 " BOOTSTRAP_HELPER " crash 1");
  CHECK(r.seconds < 15);
  CHECK(r.exit_code == 128 + 6);  // SIGABRT
  CHECK(Has(r.err, "rank 1 was killed by signal 6"));
  CHECK(Has(r.err, "stopping the other ranks"));
  CHECK(Has(r.err, "rank 0 was killed by signal 15"));
  CHECK(Has(r.err, "(stopped by plexus-run)"));
}

TEST_CASE("plexus-run: ranks that ignore SIGTERM are killed after the grace period") {
  auto r = Run("--grace 0.5 -n 3 " BOOTSTRAP_HELPER " stubborn 2");
  CHECK(r.seconds < 15);
  CHECK(r.exit_code == 3);
  CHECK(Has(r.err, "rank 2 exited with code 3"));
  CHECK(Has(r.err, "rank 0 was killed by signal 9"));
}

TEST_CASE("plexus-run --timeout stops every rank and exits 124") {
  auto r = RunShell(std::string(PLEXUS_RUN) + " --timeout 0.5 -n 2 " BOOTSTRAP_HELPER " sleep");
  CHECK(r.exit_code == 124);
  CHECK(r.seconds < 15);
  CHECK(Has(r.err, "timed out after 0.5 s"));
}

TEST_CASE("plexus-run: 3 ranks rendezvous through FromEnv, AllGather and Barrier") {
  auto r = Run("-n 3 " BOOTSTRAP_HELPER " rendezvous");
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const auto lines = Lines(r.out);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string expected = "[" + std::to_string(rank) + "] rank " + std::to_string(rank) +
                                 " of 3 local " + std::to_string(rank) +
                                 "/3 serving=" + (rank == 0 ? "1" : "0") +
                                 " gathered rank-0,rank-1,rank-2";
    CHECK(Contains(lines, expected));
  }
}
