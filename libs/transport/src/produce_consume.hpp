// Calling a Producer or Consumer (plexus/transport/types.hpp) over a range of a message: cut into
// calls of at most kMaxProduceConsumeBytes, with the error annotated the one way the contract
// (Connection::PostSendProduced) words it. Every backend calls them through here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "plexus/transport/types.hpp"

namespace plexus::transport::internal {

// `status` (from a producer or consumer called for bytes [offset, +n) of a message of `total`
// bytes) with its code kept and the range in front of its message.
inline absl::Status AnnotateCallbackError(const absl::Status& status, bool producing, size_t offset,
                                          size_t n, size_t total) {
  return absl::Status(status.code(), absl::StrCat(producing ? "producing" : "consuming", " bytes [",
                                                  offset, ", +", n, ") of a message of ", total,
                                                  " bytes: ", std::string(status.message())));
}

// Fills `out` with bytes [offset, offset + out.size()) of a message of `total` bytes.
inline absl::Status ProduceRange(Producer& producer, size_t offset, absl::Span<uint8_t> out,
                                 size_t total) {
  for (size_t done = 0; done < out.size();) {
    const size_t n = std::min(out.size() - done, kMaxProduceConsumeBytes);
    absl::Status s = producer(offset + done, out.subspan(done, n));
    if (!s.ok()) return AnnotateCallbackError(s, true, offset + done, n, total);
    done += n;
  }
  return absl::OkStatus();
}

// Hands `in`, bytes [offset, offset + in.size()) of a message of `total` bytes, to `consumer`.
inline absl::Status ConsumeRange(Consumer& consumer, size_t offset, absl::Span<const uint8_t> in,
                                 size_t total) {
  for (size_t done = 0; done < in.size();) {
    const size_t n = std::min(in.size() - done, kMaxProduceConsumeBytes);
    absl::Status s = consumer(offset + done, in.subspan(done, n));
    if (!s.ok()) return AnnotateCallbackError(s, false, offset + done, n, total);
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace plexus::transport::internal
