// One message moved between two connections of a backend with restructuring on both ends: a
// produced send and a consumed receive, as the streams (stream.hpp, device.hpp) are used.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "plexus/restructure/builder.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "transport/conformance_support.hpp"

namespace plexus::restructure::testing {

// What a collective with a bf16 wire type does to a message, as two programs of n elements: the
// sender's pack (f32 x 4 -> bf16) and the receiver's unpack (bf16 x 0.25 -> f32).
inline absl::StatusOr<Program> PackBf16(int64_t n) {
  ProgramBuilder b;
  auto x = b.Input("x", kernels::DataType::kF32, n);
  auto t = b.Scratch("t", kernels::DataType::kF32, n);
  auto w = b.Output("wire", kernels::DataType::kBF16, n);
  b.Mul(t, x, 4.0f);
  b.Cast(w, t);
  return b.Build();
}
inline absl::StatusOr<Program> UnpackBf16(int64_t n) {
  ProgramBuilder b;
  auto w = b.Input("wire", kernels::DataType::kBF16, n);
  auto y = b.Output("y", kernels::DataType::kF32, n);
  b.Mul(y, w, 0.25f);
  return b.Build();
}

// Sends `bytes` made by `produce` from one end of a fresh `backend` pair to a receive whose
// bytes go to `consume`; OK once both completions are. *largest_piece: the largest piece the
// consumer was handed.
inline absl::Status MoveProduced(transport::Backend backend, size_t bytes,
                                 transport::Producer produce, transport::Consumer consume,
                                 size_t* largest_piece = nullptr) {
  namespace pt = plexus::transport;
  pt::conformance::Config config;
  config.name = std::string(pt::BackendName(backend));
  config.backend = backend;
  auto pair = pt::conformance::MakePair(config);
  size_t largest = 0;
  absl::Status st = pair.b->PostRecvConsumed(
      bytes,
      [&](size_t off, absl::Span<const uint8_t> b) {
        largest = std::max(largest, b.size());
        return consume(off, b);
      },
      1);
  if (!st.ok()) return st;
  st = pair.a->PostSendProduced(bytes, std::move(produce), 2);
  if (!st.ok()) return st;
  for (auto* cq : {pair.cq_a.get(), pair.cq_b.get()}) {
    auto c = cq->Wait(absl::Seconds(30));
    if (!c.ok()) return c.status();
    if (!c->status.ok()) {
      return absl::Status(c->status.code(), absl::StrCat(std::string(pt::BackendName(backend)),
                                                         ": ", c->status.message()));
    }
  }
  if (largest_piece != nullptr) *largest_piece = largest;
  return absl::OkStatus();
}

}  // namespace plexus::restructure::testing
