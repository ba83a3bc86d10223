// Random instances around the real JellyBean VQA measurements (examples/data/placement/
// jellybean-vqa): p75 latencies of five of the measured worker types, the measured accuracies.
#include "plexus/placement/random_instance.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"

namespace plexus::placement {
namespace {

using base::json::Json;

struct RealType {
  const char* name;
  double price;
  bool gpu;
  double image[5];   // resnet18, 34, 50, 101, 152 (p75, ms)
  double speech[2];  // wav2vec2 base, large
  double vqa;
};

// From execution_profile_p75.csv and workers_specs.csv of the JellyBean release.
constexpr RealType kTypes[] = {
    {"cpu-1", 0.096, false, {135.1, 230.2, 308.0, 465.6, 648.8}, {264.5, 773.5}, 45.85},
    {"cpu-3", 0.384, false, {59.0, 94.4, 133.8, 229.6, 320.2}, {107.5, 299.7}, 18.51},
    {"cpu-5", 0.768, false, {36.7, 53.7, 76.2, 122.6, 168.2}, {57.9, 166.5}, 11.34},
    {"cpu-6", 2.305, false, {36.3, 50.5, 86.9, 125.2, 173.3}, {70.6, 163.0}, 11.14},
    {"gpu-1", 2.497, true, {16.1, 19.3, 18.1, 23.7, 31.1}, {14.7, 26.9}, 4.59},
};
constexpr const char* kImage[] = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"};
constexpr double kImageAccuracy[] = {89.074, 91.42, 92.866, 93.548, 94.05};
constexpr double kImageFeatureKb[] = {2.0, 2.0, 8.0, 8.0, 8.0};
constexpr const char* kSpeech[] = {"wav2vec2-base", "wav2vec2-large"};
constexpr double kSpeechAccuracy[] = {-3.823, -1.8621};
// Measured VQA accuracy for (image variant, speech variant).
constexpr double kVqaAccuracy[5][2] = {
    {54.02, 56.59}, {54.37, 56.85}, {55.42, 57.94}, {55.91, 58.19}, {55.76, 58.33}};

Json Profile(const std::string& op, const std::string& variant, const std::string& type,
             double p75) {
  return {{"operator", op},    {"variant", variant}, {"worker_type", type},
          {"p50", p75 * 0.93}, {"p75", p75},         {"p90", p75 * 1.09}};
}

Json Build(std::mt19937_64& random, const RandomInstanceOptions& options) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(random);
  };
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };

  const bool vqa_shape = integer(0, 1) == 0;
  std::vector<int> image;
  for (int v = 0; v < 5; ++v) image.push_back(v);
  std::shuffle(image.begin(), image.end(), random);
  image.resize(integer(2, 3));
  std::sort(image.begin(), image.end());
  std::vector<int> speech = {0, 1};

  Json ops = Json::array(), edges = Json::array(), accuracy = Json::array();
  Json profiles = Json::array();
  const int tiers = integer(2, std::max(2, options.max_tiers));
  const int worker_count = integer(options.min_workers, options.max_workers);
  // Worker types: each type's latencies scaled by one factor, its price jittered.
  std::vector<int> types;
  for (int t = 0; t < 5; ++t) types.push_back(t);
  std::shuffle(types.begin(), types.end(), random);
  types.resize(integer(2, 4));
  if (std::none_of(types.begin(), types.end(), [](int t) { return kTypes[t].gpu; })) {
    types.back() = 4;
  }
  std::vector<double> speed(5), price(5);
  for (int t : types) {
    speed[t] = uniform(0.8, 1.25);
    price[t] = kTypes[t].price * uniform(0.8, 1.2);
  }
  Json worker_types = Json::array();
  for (int t : types) {
    worker_types.push_back(
        {{"name", kTypes[t].name}, {"price_per_hour", price[t]}, {"gpu", kTypes[t].gpu}});
  }

  Json image_variants = Json::array(), image_rows = Json::object();
  for (int v : image) image_variants.push_back(kImage[v]);
  if (vqa_shape) {
    ops = {{{"name", "ReadImage"}, {"kind", "source"}},
           {{"name", "ReadSpeech"}, {"kind", "source"}},
           {{"name", "Image"}, {"kind", "ml"}, {"variants", image_variants}},
           {{"name", "Speech"}, {"kind", "ml"}, {"variants", {kSpeech[0], kSpeech[1]}}},
           {{"name", "VQA"}, {"kind", "ml"}}};
    Json feature_sizes = Json::array();
    for (int v : image) {
      feature_sizes.push_back({{"from_variant", kImage[v]}, {"kb", kImageFeatureKb[v]}});
    }
    edges = {{{"from", "ReadImage"}, {"to", "Image"}, {"message_kb", {{{"kb", 794.0}}}}},
             {{"from", "ReadSpeech"}, {"to", "Speech"}, {"message_kb", {{{"kb", 97.1}}}}},
             {{"from", "Image"}, {"to", "VQA"}, {"message_kb", feature_sizes}},
             {{"from", "Speech"}, {"to", "VQA"}, {"message_kb", {{{"kb", 0.1}}}}}};
    for (int v : image)
      image_rows[kImage[v]] = {{{"in", Json::array()}, {"out", kImageAccuracy[v]}}};
    Json speech_rows = Json::object(), vqa_rows = Json::array();
    for (int s : speech)
      speech_rows[kSpeech[s]] = {{{"in", Json::array()}, {"out", kSpeechAccuracy[s]}}};
    for (int v : image) {
      for (int s : speech) {
        vqa_rows.push_back(
            {{"in", {kImageAccuracy[v], kSpeechAccuracy[s]}}, {"out", kVqaAccuracy[v][s]}});
      }
    }
    accuracy = {{{"operator", "Image"}, {"variants", image_rows}},
                {{"operator", "Speech"}, {"variants", speech_rows}},
                {{"operator", "VQA"},
                 {"inputs", {"Image", "Speech"}},
                 {"variants", {{"default", vqa_rows}}}}};
    for (int t : types) {
      for (int v : image)
        profiles.push_back(
            Profile("Image", kImage[v], kTypes[t].name, kTypes[t].image[v] * speed[t]));
      for (int s : speech)
        profiles.push_back(
            Profile("Speech", kSpeech[s], kTypes[t].name, kTypes[t].speech[s] * speed[t]));
      profiles.push_back(Profile("VQA", "default", kTypes[t].name, kTypes[t].vqa * speed[t]));
    }
  } else {
    // A chain: camera -> detection (image models) -> re-identification (speech-sized models) ->
    // tracking (relational, VQA-sized).
    const double crops = uniform(1.0, 2.5);
    ops = {{{"name", "Camera"}, {"kind", "source"}},
           {{"name", "Detect"}, {"kind", "ml"}, {"variants", image_variants}},
           {{"name", "ReId"}, {"kind", "ml"}, {"variants", {"reid-small", "reid-large"}}},
           {{"name", "Track"}, {"kind", "relational"}}};
    edges = {
        {{"from", "Camera"}, {"to", "Detect"}, {"message_kb", {{{"kb", 400.0}}}}},
        {{"from", "Detect"},
         {"to", "ReId"},
         {"rate_ratio", crops},
         {"message_kb", {{{"kb", 30.0}}}}},
        {{"from", "ReId"}, {"to", "Track"}, {"message_kb", {{{"to_variant", "*"}, {"kb", 1.0}}}}}};
    Json reid_rows = Json::object();
    for (int v : image) {
      image_rows[kImage[v]] = {{{"in", Json::array()}, {"out", kImageAccuracy[v] - 30}}};
    }
    const double gain[2] = {0, uniform(2, 5)};
    for (int s = 0; s < 2; ++s) {
      Json rows = Json::array();
      for (int v : image) {
        rows.push_back(
            {{"in", {kImageAccuracy[v] - 30}}, {"out", 0.8 * (kImageAccuracy[v] - 30) + gain[s]}});
      }
      reid_rows[s == 0 ? "reid-small" : "reid-large"] = rows;
    }
    accuracy = {{{"operator", "Detect"}, {"variants", image_rows}},
                {{"operator", "ReId"}, {"inputs", {"Detect"}}, {"variants", reid_rows}}};
    for (int t : types) {
      for (int v : image)
        profiles.push_back(
            Profile("Detect", kImage[v], kTypes[t].name, 1.5 * kTypes[t].image[v] * speed[t]));
      profiles.push_back(
          Profile("ReId", "reid-small", kTypes[t].name, 0.3 * kTypes[t].speech[0] * speed[t]));
      profiles.push_back(
          Profile("ReId", "reid-large", kTypes[t].name, 0.3 * kTypes[t].speech[1] * speed[t]));
      profiles.push_back(Profile("Track", "default", kTypes[t].name, kTypes[t].vqa * speed[t]));
    }
  }

  Json tier_list = Json::array(), network = Json::array();
  const char* tier_names[] = {"edge", "hub", "cloud"};
  const std::vector<std::string> names =
      tiers == 2 ? std::vector<std::string>{"edge", "cloud"}
                 : std::vector<std::string>{tier_names[0], tier_names[1], tier_names[2]};
  for (const std::string& name : names) tier_list.push_back({{"name", name}});
  std::vector<double> step(tiers, 0);
  for (int a = 0; a + 1 < tiers; ++a) step[a] = uniform(0.05, 0.2);
  for (int a = 0; a < tiers; ++a) {
    for (int b = a + 1; b < tiers; ++b) {
      double sum = 0;
      for (int k = a; k < b; ++k) sum += step[k];
      network.push_back({{"from", names[a]},
                         {"to", names[b]},
                         {"price_per_gb", sum * 0.9},
                         {"latency_ms", 10.0 * (b - a)},
                         {"bandwidth_gbps", 1.0}});
    }
  }
  Json workers = Json::array();
  for (int w = 0; w < worker_count; ++w) {
    const int t = types[integer(0, static_cast<int>(types.size()) - 1)];
    const int tier = kTypes[t].gpu ? tiers - 1 : integer(0, tiers - 1);
    workers.push_back(
        {{"name", absl::StrCat("w", w)}, {"type", kTypes[t].name}, {"tier", names[tier]}});
  }
  // At least one GPU and one edge CPU so that both ends of the trade-off exist.
  workers.push_back({{"name", "cloud-gpu"}, {"type", "gpu-1"}, {"tier", names.back()}});
  if (std::find(types.begin(), types.end(), 4) == types.end()) {
    worker_types.push_back({{"name", "gpu-1"}, {"price_per_hour", kTypes[4].price}, {"gpu", true}});
    // gpu-1 profiles at the measured speed.
    speed[4] = 1;
    if (vqa_shape) {
      for (int v : image)
        profiles.push_back(Profile("Image", kImage[v], "gpu-1", kTypes[4].image[v]));
      for (int s : speech)
        profiles.push_back(Profile("Speech", kSpeech[s], "gpu-1", kTypes[4].speech[s]));
      profiles.push_back(Profile("VQA", "default", "gpu-1", kTypes[4].vqa));
    } else {
      for (int v : image)
        profiles.push_back(Profile("Detect", kImage[v], "gpu-1", 1.5 * kTypes[4].image[v]));
      profiles.push_back(Profile("ReId", "reid-small", "gpu-1", 0.3 * kTypes[4].speech[0]));
      profiles.push_back(Profile("ReId", "reid-large", "gpu-1", 0.3 * kTypes[4].speech[1]));
      profiles.push_back(Profile("Track", "default", "gpu-1", kTypes[4].vqa));
    }
  }
  Json sources = Json::array();
  for (const Json& op : ops) {
    if (op["kind"] == "source") sources.push_back({{"operator", op["name"]}, {"tier", "edge"}});
  }
  Json root;
  root["name"] = "random";
  root["description"] = "random instance around the JellyBean VQA measurements";
  root["workflow"] = {{"operators", ops}, {"edges", edges}};
  root["accuracy_profiles"] = accuracy;
  root["execution_profiles"] = profiles;
  root["infrastructure"] = {{"tiers", tier_list},
                            {"worker_types", worker_types},
                            {"workers", workers},
                            {"network", network},
                            {"sources", sources}};
  root["objective"] = {{"accuracy_target", 0.0}, {"input_rate", uniform(3, 30)}};
  return root;
}

}  // namespace

Problem RandomInstance(const RandomInstanceOptions& options) {
  std::mt19937_64 random(options.seed * 0x9E3779B97F4A7C15ull + 17);
  for (int attempt = 0;; ++attempt) {
    Json root = Build(random, options);
    auto problem = ParseProblem(root.dump());
    if (!problem.ok()) continue;  // cannot happen with the tables above; retried defensively
    // Target: the accuracy of a random variant choice, so that a cheaper one may not reach it.
    const double best = BestReachableAccuracy(*problem);
    std::vector<int> variant = internal::DefaultVariants(*problem);
    for (size_t op = 0; op < problem->operators.size(); ++op) {
      if (problem->operators[op].kind == OperatorKind::kMl) {
        variant[op] = std::uniform_int_distribution<int>(
            0, static_cast<int>(problem->operators[op].variants.size()) - 1)(random);
      }
    }
    const double target = EstimateAccuracy(*problem, variant);
    problem->objective.accuracy_target = std::isfinite(target) ? target : best;
    // Lower the rate until the instance is feasible (every few attempts, start over).
    for (int shrink = 0; shrink < 6; ++shrink) {
      if (internal::RunJellyBean(*problem).ok()) return *std::move(problem);
      problem->objective.input_rate *= 0.6;
      root["objective"]["input_rate"] = problem->objective.input_rate;
      root["objective"]["accuracy_target"] = problem->objective.accuracy_target;
      auto reparsed = ParseProblem(root.dump());
      if (!reparsed.ok()) break;
      *problem = *std::move(reparsed);
    }
    (void)attempt;
  }
}

}  // namespace plexus::placement
