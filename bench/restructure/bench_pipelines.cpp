#include "bench_pipelines.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "plexus/restructure/pipelines.hpp"
#include "plexus/tooling/launch.hpp"

namespace plexus::bench::restructure {
namespace pp = plexus::restructure::pipelines;
using plexus::kernels::DataType;

namespace {

int64_t Scaled(int64_t full, double scale, int64_t least) {
  return std::max(least, static_cast<int64_t>(std::llround(static_cast<double>(full) * scale)));
}

struct Shapes {
  pp::VideoShape video;
  pp::SoundShape sound;
  pp::BrainShape brain;
  pp::PiiShape pii;
  pp::JoinShape join;
};

Shapes ScaledShapes(double scale) {
  Shapes s;
  s.video.height = Scaled(s.video.height, scale, 2) & ~int64_t{1};  // even: the 2x2 pool
  s.sound.frames = Scaled(s.sound.frames, scale, 1);
  s.brain.windows = Scaled(s.brain.windows, scale, 1);
  s.pii.rows = Scaled(s.pii.rows, scale, 1);
  s.join.rows = Scaled(s.join.rows, scale, 1);
  return s;
}

}  // namespace

std::vector<PipelineProgram> PipelinePrograms(double shape_scale, bool f16_brain) {
  Shapes s = ScaledShapes(shape_scale);
  if (f16_brain) s.brain.out_dtype = DataType::kF16;
  std::vector<PipelineProgram> out;
  out.push_back({"video-surveillance", pp::VideoSurveillance(s.video), true});
  out.push_back({"sound-detection", pp::SoundDetection(s.sound), false});
  out.push_back({"brain-stimulation", pp::BrainStimulation(s.brain), false});
  out.push_back({"pii-redaction", pp::PiiRedaction(s.pii), true});
  out.push_back({"db-hash-join", pp::DbHashJoin(s.join), true});
  return out;
}

nlohmann::json PipelineShapesJson(double shape_scale) {
  const Shapes s = ScaledShapes(shape_scale);
  return {{"video_h", s.video.height},      {"video_w", s.video.width},
          {"sound_frames", s.sound.frames}, {"sound_bins", s.sound.bins},
          {"brain_w", s.brain.windows},     {"brain_b", s.brain.bins},
          {"brain_e", s.brain.electrodes},  {"pii_parts", s.pii.parts},
          {"pii_rows", s.pii.rows},         {"pii_cols", s.pii.cols},
          {"db_parts", s.join.parts},       {"db_rows", s.join.rows},
          {"db_cols", s.join.cols}};
}

std::map<std::pair<std::string, std::string>, double> PythonPeerTimes(
    const char* who, const std::string& python, int runs, double shape_scale,
    const std::vector<std::string>& extra, bool* ok) {
  namespace pt = plexus::tooling;
  std::map<std::pair<std::string, std::string>, double> ms;
  pt::LaunchOptions lo;
  lo.argv = {python,     PLEXUS_RESTRUCTURE_PEERS,
             "--runs",   std::to_string(runs),
             "--shapes", PipelineShapesJson(shape_scale).dump()};
  lo.argv.insert(lo.argv.end(), extra.begin(), extra.end());
  lo.plexus_env = false;
  lo.output = pt::OutputMode::kCallback;
  lo.timeout = absl::Minutes(10);
  lo.on_line = [&](pt::Launcher&, int, pt::Stream stream, std::string_view line) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (stream == pt::Stream::kStdout && j.is_object() && j.contains("ms")) {
      ms[{j["peer"].get<std::string>(), j["stage"].get<std::string>()}] = j["ms"].get<double>();
    } else {
      std::fprintf(stderr, "[python] %.*s\n", static_cast<int>(line.size()), line.data());
    }
  };
  auto r = pt::Launch(std::move(lo));
  *ok = r.ok() && r->first_failure < 0;
  if (!*ok) {
    std::fprintf(stderr, "%s: the python peers failed%s\n", who,
                 r.ok() ? "" : (": " + r.status().ToString()).c_str());
  }
  return ms;
}

std::vector<uint8_t> RandomInput(const plexus::restructure::BufferDecl& b, std::mt19937& rng) {
  std::vector<uint8_t> v(static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype));
  if (b.dtype == DataType::kF32) {
    std::uniform_real_distribution<float> d(0.001f, 4.0f);
    for (size_t i = 0; i < v.size() / 4; ++i) {
      const float x = d(rng);
      std::memcpy(v.data() + 4 * i, &x, 4);
    }
  } else {
    for (auto& x : v) x = static_cast<uint8_t>(rng() & 0x3f);
  }
  return v;
}

}  // namespace plexus::bench::restructure
