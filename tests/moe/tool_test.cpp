// Runs the plexus-moe tool end to end on the bundled scenarios and checks its JSON output.
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "nlohmann/json.hpp"

namespace {

const std::string kTool = PLEXUS_MOE_TOOL;
const std::string kData = PLEXUS_MOE_DATA_DIR;

struct Run {
  int exit_code = -1;
  std::string output;
};

Run Exec(const std::string& args, bool merge_stderr = false) {
  const std::string command = "'" + kTool + "' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Run run;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

nlohmann::json Json(const std::string& args) {
  const Run run = Exec(args + " --json");
  INFO(args);
  REQUIRE(run.exit_code == 0);
  nlohmann::json doc = nlohmann::json::parse(run.output, nullptr, false);
  REQUIRE_FALSE(doc.is_discarded());
  return doc;
}

TEST_CASE("plexus-moe plan, recovery and simulate on the bundled GPT-L scenario", "[moe][tool]") {
  const std::string scenario = "--scenario '" + kData + "/gpt-l.json'";

  const nlohmann::json plan = Json("plan " + scenario);
  REQUIRE(plan["layers"].size() == 12);
  for (const auto& layer : plan["layers"]) {
    int total = 0;
    for (int r : layer["replicas"]) {
      CHECK(r >= 2);
      total += r;
    }
    CHECK(total == 60);
    CHECK(layer["node_slots"].size() == 10);
  }

  const nlohmann::json recovery = Json("recovery " + scenario + " --failures 4");
  const double mro = recovery["policies"]["mro"]["probability"];
  const double spread = recovery["policies"]["spread"]["probability"];
  CHECK(recovery["policies"]["mro"]["exact"] == true);
  CHECK(recovery["policies"]["mro"]["total_sets"] == 210);
  CHECK(mro > spread);

  const nlohmann::json sim =
      Json("simulate " + scenario + " --schedule '" + kData + "/bamboo/p3-trace.csv'");
  CHECK(sim["events"] == 344);
  const auto& systems = sim["systems"];
  REQUIRE(systems.contains("lazarus"));
  REQUIRE(systems.contains("checkpoint_restart"));
  REQUIRE(systems.contains("ep_reconfigure"));
  CHECK(systems["lazarus"]["samples"].get<double>() >
        systems["checkpoint_restart"]["samples"].get<double>());
  CHECK(systems["lazarus"]["failures"].get<int>() > 0);
  CHECK(systems["lazarus"]["mean_nodes_in_use"].get<double>() <= 10.0 + 1e-9);
  CHECK(systems["lazarus"]["timeline"].size() > 600);  // 60 s points over 11.4 h
}

TEST_CASE("plexus-moe dispatch and reconfigure", "[moe][tool]") {
  const nlohmann::json d = Json("dispatch --input '" + kData + "/dispatch-example.json'");
  int64_t processed = 0;
  for (const auto& r : d["ranks"]) processed += r["processed"].get<int64_t>();
  CHECK(processed == 228);  // every token of the example
  const nlohmann::json r =
      Json("reconfigure --scenario '" + kData + "/gpt-m.json' --fail 3,7 --join 1");
  CHECK(r["physical_of_plan_node"].size() == 9);
  CHECK(r["bytes_moved"].get<int64_t>() > 0);
  CHECK(r["needs_checkpoint_restart"] == false);
}

TEST_CASE("plexus-moe reports bad input clearly", "[moe][tool]") {
  const std::string scenario = "--scenario '" + kData + "/gpt-s.json'";
  Run run = Exec("recovery " + scenario + " --failures 11", true);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("exceeds the 10 nodes") != std::string::npos);
  run = Exec("plan " + scenario + " --nodes 0", true);
  CHECK(run.exit_code == 2);  // a usage error, as for every flag out of its range
  CHECK(run.output.find("--nodes is out of range: expects an integer in 1..2147483647, got 0") !=
        std::string::npos);
  run = Exec("plan --scenario /nonexistent.json", true);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("cannot open") != std::string::npos);
  run = Exec("frobnicate", true);
  CHECK(run.exit_code == 2);
}

}  // namespace

namespace {

// Writes `text` to a fresh file under /tmp and returns its path.
std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/plexus-moe-tool-" + std::to_string(getpid()) + "-" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

}  // namespace

TEST_CASE("plexus-moe refuses plans that cannot fit in memory, naming the limit", "[moe][tool]") {
  const std::string scenario = "--scenario '" + kData + "/gpt-s.json'";
  // These died with an uncaught std::bad_alloc (exit 134).
  for (const std::string nodes : {"100000000", "1000000000"}) {
    const Run run = Exec("plan " + scenario + " --nodes " + nodes, true);
    INFO(run.output);
    CHECK(run.exit_code == 1);
    CHECK(run.output == "plexus-moe: " + nodes + " nodes x 6 slots x 12 layers = " +
                            std::to_string(std::stoll(nodes) * 72) +
                            " expert slots; at most 50000000 fit (use fewer nodes)\n");
  }
  nlohmann::json doc = nlohmann::json::parse(R"({"nodes": 1e8, "slots_per_node": 2,
                                                 "layer_loads": [[1, 2]]})");
  const std::string path = TempFile("huge.json", doc.dump());
  const Run run = Exec("plan --scenario " + path, true);
  unlink(path.c_str());
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("scenario.nodes must be at most 1000000 (got 100000000)") !=
        std::string::npos);
}

TEST_CASE("plexus-moe rejects misspelt JSON fields", "[moe][tool]") {
  const std::string scenario =
      TempFile("misspelt.json", R"({"nodes": 4, "slots_per_nod": 2, "slots_per_node": 2,
                           "layer_loads": [[1, 2]]})");
  Run run = Exec("plan --scenario " + scenario, true);
  unlink(scenario.c_str());
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("scenario.slots_per_nod: unknown field (expected one of: name, "
                        "description, nodes, slots_per_node, min_replicas, layer_loads, "
                        "training)") != std::string::npos);
  const std::string training =
      TempFile("training.json", R"({"nodes": 4, "slots_per_node": 2, "layer_loads": [[1, 2]],
                           "training": {"restart": 5}})");
  run = Exec("plan --scenario " + training, true);
  unlink(training.c_str());
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("scenario.training.restart: unknown field") != std::string::npos);
  const std::string schedule =
      TempFile("schedule.json",
               R"({"end_s": 10, "events": [{"time_s": 1, "op": "add", "node": "a", "nod": "b"}]})");
  run = Exec("simulate --scenario '" + kData + "/gpt-s.json' --schedule " + schedule, true);
  unlink(schedule.c_str());
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("schedule.events[0].nod: unknown field") != std::string::npos);
}

TEST_CASE("plexus-moe: --help for every command, directories named, no half tables",
          "[moe][tool]") {
  for (const std::string command : {"plan", "recovery", "dispatch", "reconfigure", "simulate"}) {
    const Run run = Exec(command + " --help");
    INFO(command);
    CHECK(run.exit_code == 0);
    CHECK(run.output.find("Usage: plexus-moe " + command) != std::string::npos);
  }
  Run run = Exec("plan --scenario /tmp", true);
  CHECK(run.exit_code == 1);
  CHECK(run.output == "plexus-moe: '/tmp' is a directory; expected a file\n");
  run = Exec("plan --scenario '" + kData + "/gpt-s.json' --nodes abc", true);
  CHECK(run.exit_code == 2);
  CHECK(run.output ==
        "plexus-moe: --nodes expects an integer in 1..2147483647, got 'abc'\n"
        "Run 'plexus-moe --help' for the usage.\n");
  // The error comes after the first policy's row: stdout must stay empty.
  run = Exec("recovery --scenario '" + kData + "/gpt-s.json' --failures 2 --method bogus");
  CHECK(run.exit_code == 1);
  CHECK(run.output.empty());
}
