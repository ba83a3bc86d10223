// Input parsing and validation: every bundled scenario loads; bad input names the element.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "plexus/placement/optimizer.hpp"
#include "plexus/placement/problem.hpp"
#include "test_support.hpp"

namespace plexus::placement {
namespace {

using nlohmann::json;

std::string ErrorOf(const json& input) {
  auto problem = ParseProblem(input.dump());
  REQUIRE_FALSE(problem.ok());
  return std::string(problem.status().message());
}

TEST_CASE("the tiny problem parses with derived rates and order", "[placement]") {
  auto problem = ParseProblem(testing::TinyProblem().dump());
  REQUIRE(problem.ok());
  CHECK(problem->operators.size() == 3);
  CHECK(problem->workers.size() == 4);  // "count": 2 expands to e-0, e-1
  CHECK(problem->FindWorker("e-1") >= 0);
  CHECK(problem->topological_order.front() == problem->FindOperator("camera"));
  CHECK(problem->rate[problem->FindOperator("track")] == Approx(8));
  CHECK(problem->objective.sink == problem->FindOperator("detect"));  // the only ML operator
  CHECK(WorkerThroughput(*problem, 1, 1, problem->FindWorker("e-0")) == Approx(4));  // p75
}

TEST_CASE("every bundled scenario loads and round-trips", "[placement]") {
  int count = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(PLEXUS_PLACEMENT_DATA_DIR)) {
    if (entry.path().extension() != ".json" || entry.path().parent_path().filename() == "raw") {
      continue;
    }
    INFO(entry.path());
    auto problem = LoadProblem(entry.path().string());
    REQUIRE(problem.ok());
    ++count;
    auto again = ParseProblem(ProblemToJson(*problem));
    REQUIRE(again.ok());
    CHECK(again->workers.size() == problem->workers.size());
    CHECK(again->rate == problem->rate);
    auto a = Optimize(*problem, Strategy::kJellyBean);
    auto b = Optimize(*again, Strategy::kJellyBean);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->total_cost == Approx(b->total_cost));
  }
  CHECK(count >= 9);  // 8 synthetic + the real JellyBean VQA input
}

TEST_CASE("the real JellyBean VQA input keeps the release's numbers", "[placement]") {
  auto problem = LoadProblem(testing::DataFile("jellybean-vqa/vqa-medium-release.json"));
  REQUIRE(problem.ok());
  CHECK(problem->objective.accuracy_target == Approx(56.0));
  CHECK(problem->rate[problem->FindOperator("VQA")] == Approx(40));
  CHECK(problem->workers.size() == 9);
  CHECK(BestReachableAccuracy(*problem) == Approx(58.33));
  const int gpu = problem->FindWorker("workflow-compute-gpu-1");
  const int op = problem->FindOperator("SpeechRecognition");
  // p75 of wav2vec2-large on gpu-1 is 26.894737666666668 ms in the release.
  CHECK(WorkerThroughput(*problem, op, problem->FindVariant(op, "wav2vec2-large-960h-lv60-self"),
                         gpu) == Approx(1000 / 26.894737666666668));
}

TEST_CASE("bad input is reported with the element at fault", "[placement]") {
  SECTION("not JSON") {
    auto problem = ParseProblem("{\"workflow\": [");
    REQUIRE_FALSE(problem.ok());
    CHECK_THAT(std::string(problem.status().message()), Catch::Contains("not valid JSON"));
  }
  SECTION("empty text") { CHECK_FALSE(ParseProblem("").ok()); }
  SECTION("missing file") {
    auto problem = LoadProblem("/nonexistent/placement.json");
    REQUIRE_FALSE(problem.ok());
    CHECK_THAT(std::string(problem.status().message()), Catch::Contains("cannot open"));
  }
  json input = testing::TinyProblem();
  SECTION("unknown operator in an edge") {
    input["workflow"]["edges"][1]["to"] = "trak";
    const std::string error = ErrorOf(input);
    CHECK_THAT(error, Catch::Contains("workflow.edges[1].to"));
    CHECK_THAT(error, Catch::Contains("unknown operator 'trak'"));
  }
  SECTION("a cycle") {
    input["workflow"]["operators"].push_back({{"name", "fuse"}, {"kind", "relational"}});
    input["workflow"]["edges"].push_back(
        {{"from", "track"}, {"to", "fuse"}, {"message_kb", {{{"kb", 1}}}}});
    input["workflow"]["edges"].push_back(
        {{"from", "fuse"}, {"to", "track"}, {"message_kb", {{{"kb", 1}}}}});
    input["workflow"]["operators"][2]["combine"] = "union";
    const std::string error = ErrorOf(input);
    CHECK_THAT(error, Catch::Contains("cycle"));
    CHECK_THAT(error, Catch::Contains("track"));
    CHECK_THAT(error, Catch::Contains("fuse"));
  }
  SECTION("a variant without execution profiles") {
    input["workflow"]["operators"][1]["variants"].push_back("huge");
    input["accuracy_profiles"][0]["variants"]["huge"] = {{{"in", json::array()}, {"out", 0.9}}};
    const std::string error = ErrorOf(input);
    CHECK_THAT(error,
               Catch::Contains("variant 'huge' of operator 'detect' has no execution profile"));
  }
  SECTION("a variant without accuracy rows") {
    input["accuracy_profiles"][0]["variants"].erase("big");
    CHECK_THAT(ErrorOf(input), Catch::Contains("variant 'big' of 'detect' has no accuracy rows"));
  }
  SECTION("negative rate") {
    input["objective"]["input_rate"] = -5;
    CHECK_THAT(ErrorOf(input), Catch::Contains("objective.input_rate: must be > 0"));
  }
  SECTION("negative price") {
    input["infrastructure"]["worker_types"][0]["price_per_hour"] = -1;
    CHECK_THAT(ErrorOf(input),
               Catch::Contains("infrastructure.worker_types[0].price_per_hour: must be >= 0"));
  }
  SECTION("negative worker count") {
    input["infrastructure"]["workers"][0]["count"] = -2;
    CHECK_THAT(ErrorOf(input), Catch::Contains("infrastructure.workers[0].count"));
  }
  SECTION("unknown worker type in a profile") {
    input["execution_profiles"][0]["worker_type"] = "tpu";
    CHECK_THAT(ErrorOf(input),
               Catch::Contains("execution_profiles[0].worker_type: unknown worker type 'tpu'"));
  }
  SECTION("decreasing percentiles") {
    input["execution_profiles"][0]["p90"] = 50;
    CHECK_THAT(ErrorOf(input),
               Catch::Contains("execution_profiles[0]: percentiles must not decrease"));
  }
  SECTION("a misspelt field") {
    input["objective"]["acuracy_target"] = 0.5;
    CHECK_THAT(ErrorOf(input), Catch::Contains("objective.acuracy_target: unknown field"));
  }
  SECTION("wrong type") {
    input["workflow"]["operators"] = "camera";
    CHECK_THAT(ErrorOf(input),
               Catch::Contains("workflow.operators: expected an array, got string"));
  }
  SECTION("a missing tier link") {
    input["infrastructure"]["network"] = json::array();
    CHECK_THAT(ErrorOf(input), Catch::Contains("no link from tier 'edge' to tier 'cloud'"));
  }
  SECTION("a downward link") {
    input["infrastructure"]["network"][0]["from"] = "cloud";
    input["infrastructure"]["network"][0]["to"] = "edge";
    CHECK_THAT(ErrorOf(input), Catch::Contains("infrastructure.network[0]"));
  }
  SECTION("a source without a place") {
    input["infrastructure"]["sources"] = json::array();
    CHECK_THAT(ErrorOf(input), Catch::Contains("source 'camera' has no tier and location"));
  }
  SECTION("a location outside the tier") {
    input["infrastructure"]["workers"][1]["location"] = 3;
    CHECK_THAT(ErrorOf(input), Catch::Contains("infrastructure.workers[1].location"));
  }
  SECTION("accuracy rows of the wrong width") {
    input["accuracy_profiles"][0]["variants"]["big"][0]["in"] = {0.5};
    CHECK_THAT(ErrorOf(input), Catch::Contains("accuracy_profiles[0].variants.big[0].in"));
  }
  SECTION("a join of unequal rates") {
    input["workflow"]["operators"].push_back({{"name", "mic"}, {"kind", "source"}});
    input["workflow"]["edges"].push_back(
        {{"from", "mic"}, {"to", "track"}, {"rate_ratio", 2}, {"message_kb", {{{"kb", 1}}}}});
    input["infrastructure"]["sources"].push_back({{"operator", "mic"}, {"tier", "edge"}});
    CHECK_THAT(ErrorOf(input), Catch::Contains("join 'track'"));
  }
  SECTION("a missing message size") {
    input["workflow"]["edges"][0]["message_kb"] = {{{"to_variant", "small"}, {"kb", 5}}};
    CHECK_THAT(ErrorOf(input), Catch::Contains("no message size for variants (source, big)"));
  }
}

}  // namespace
}  // namespace plexus::placement
