// The runtime's checkpoint file: a round trip, and every file that is not this run's refused
// with DataLoss naming the file and what is wrong (another run, flipped bytes, NaN weights, a
// step beyond the run's, bad magic, a wrong size).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/hash.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/model.hpp"

namespace pm = plexus::moe;
namespace rt = plexus::moe::runtime;

namespace {

const std::string kPath = "run/moe.ckpt";

pm::ModelSpec Spec() {
  pm::ModelSpec c;
  c.layers = 2;
  c.experts = 4;
  c.hidden = 8;
  c.ffn = 16;
  return c;
}

// `decoded` failed with DataLoss naming the file and saying `says`.
void CheckRefused(const absl::StatusOr<rt::Checkpoint>& decoded, const std::string& says) {
  REQUIRE_FALSE(decoded.ok());
  const std::string message(decoded.status().message());
  INFO(message);
  CHECK(absl::IsDataLoss(decoded.status()));
  CHECK(absl::StrContains(message, "checkpoint " + kPath + " "));
  CHECK(absl::StrContains(message, says));
}

// Rewrites the trailing checksum so that only the field under test is wrong.
void Reseal(std::string& data) {
  const size_t body = data.size() - sizeof(uint64_t);
  plexus::base::StoreLittleEndian<uint64_t>(reinterpret_cast<uint8_t*>(&data[body]),
                                            plexus::base::Fnv1a64(data.substr(0, body)));
}

}  // namespace

TEST_CASE("a checkpoint reads back bit for bit", "[moe][runtime][checkpoint]") {
  const rt::Layout layout(Spec());
  const std::vector<float> state = rt::InitialState(layout);
  auto back = rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, 12, state), kPath, layout, 12);
  REQUIRE(back.ok());
  CHECK(back->step == 12);
  CHECK(back->state == state);
}

TEST_CASE("a checkpoint of another run is refused", "[moe][runtime][checkpoint]") {
  const rt::Layout layout(Spec());
  pm::ModelSpec other_spec = Spec();
  other_spec.seed = 2;  // same shape and size, another run
  const rt::Layout other(other_spec);
  const std::string data = rt::EncodeCheckpoint(other, 4, rt::InitialState(other));
  CheckRefused(rt::DecodeCheckpoint(data, kPath, layout, 100), "is of another model or run");

  pm::ModelSpec lr = Spec();
  lr.learning_rate = 0.01f;
  CheckRefused(rt::DecodeCheckpoint(
                   rt::EncodeCheckpoint(rt::Layout(lr), 4, rt::InitialState(rt::Layout(lr))), kPath,
                   layout, 100),
               "is of another model or run");

  pm::ModelSpec wider = Spec();
  wider.hidden = 12;
  const rt::Layout wide(wider);
  CheckRefused(rt::DecodeCheckpoint(rt::EncodeCheckpoint(wide, 4, rt::InitialState(wide)), kPath,
                                    layout, 100),
               "floats, this model has");
}

TEST_CASE("flipped bytes are refused by the checksum", "[moe][runtime][checkpoint]") {
  const rt::Layout layout(Spec());
  const std::string good = rt::EncodeCheckpoint(layout, 6, rt::InitialState(layout));
  for (size_t at : {size_t{9}, size_t{40}, good.size() / 2, good.size() - 9, good.size() - 1}) {
    INFO("byte " << at);
    std::string bad = good;
    bad[at] ^= 0x10;
    bad[at - 1] ^= 0x01;
    CheckRefused(rt::DecodeCheckpoint(bad, kPath, layout, 100), "is corrupt: its checksum is");
  }
}

TEST_CASE("non-finite weights are refused, naming where they are", "[moe][runtime][checkpoint]") {
  const rt::Layout layout(Spec());
  std::vector<float> state(layout.total, std::numeric_limits<float>::quiet_NaN());
  CheckRefused(rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, 2, state), kPath, layout, 10),
               "holds a non-finite value (nan) at float 0, gate weights of layer 0");
  state = rt::InitialState(layout);
  state[layout.ExpertOffset(1, 2) + 3] = std::numeric_limits<float>::infinity();
  CheckRefused(rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, 2, state), kPath, layout, 10),
               "weights of layer 1 expert 2");
}

TEST_CASE("a step beyond the run's is refused", "[moe][runtime][checkpoint]") {
  const rt::Layout layout(Spec());
  const std::vector<float> state = rt::InitialState(layout);
  CheckRefused(rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, int64_t{1} << 62, state), kPath,
                                    layout, 40),
               "is at step 4611686018427387904, outside this run's 0..40");
  CheckRefused(rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, 300, state), kPath, layout, 40),
               "is at step 300, outside this run's 0..40");
  CheckRefused(rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, -1, state), kPath, layout, 40),
               "is at step -1");
  CHECK(rt::DecodeCheckpoint(rt::EncodeCheckpoint(layout, 40, state), kPath, layout, 40).ok());
}

TEST_CASE("bad magic and sizes say what is wrong", "[moe][runtime][checkpoint]") {
  const rt::Layout layout(Spec());
  const std::string good = rt::EncodeCheckpoint(layout, 6, rt::InitialState(layout));
  const size_t want = good.size();

  std::string bad = good;
  bad.replace(0, 8, "GARBAGE!");
  CheckRefused(rt::DecodeCheckpoint(bad, kPath, layout, 100),
               "is not a checkpoint of this runtime: it starts with \"GARBAGE!\", not the magic "
               "\"PXMOECK2\" (" +
                   std::to_string(want) + " bytes)");

  bad = good;
  bad[7] = '1';
  CheckRefused(rt::DecodeCheckpoint(bad, kPath, layout, 100), "is in format 1 (magic PXMOECK1");

  CheckRefused(rt::DecodeCheckpoint("", kPath, layout, 100), "is empty (0 bytes)");
  CheckRefused(rt::DecodeCheckpoint(good.substr(0, 20), kPath, layout, 100),
               "is truncated: 20 bytes, shorter than the 40 bytes of the header and checksum");

  bad = good.substr(0, want - 100);
  CheckRefused(rt::DecodeCheckpoint(bad, kPath, layout, 100),
               "is " + std::to_string(want - 100) + " bytes, but a checkpoint of " +
                   std::to_string(layout.total) + " floats is " + std::to_string(want) +
                   " bytes: it is truncated");
  bad = good + "xyz";
  CheckRefused(rt::DecodeCheckpoint(bad, kPath, layout, 100),
               "is " + std::to_string(want + 3) + " bytes, but a checkpoint of " +
                   std::to_string(layout.total) + " floats is " + std::to_string(want) +
                   " bytes: it is followed by extra bytes");
  // The header's float count is checked against the model before the size.
  bad = good;
  plexus::base::StoreLittleEndian<int64_t>(reinterpret_cast<uint8_t*>(&bad[16]), 7);
  Reseal(bad);
  CheckRefused(rt::DecodeCheckpoint(bad, kPath, layout, 100),
               "holds 7 floats, this model has " + std::to_string(layout.total));
}
