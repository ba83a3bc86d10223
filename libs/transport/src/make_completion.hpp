// The one place that fills a Completion; every backend reports through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "plexus/transport/completion.hpp"

namespace plexus::transport::internal {

inline Completion MakeCompletion(uint64_t connection_id, Opcode opcode, uint64_t wr_id,
                                 absl::Status status, size_t bytes,
                                 std::optional<uint32_t> immediate = std::nullopt) {
  Completion c;
  c.wr_id = wr_id;
  c.opcode = opcode;
  c.status = std::move(status);
  c.bytes = bytes;
  c.has_immediate = immediate.has_value();
  c.immediate = immediate.value_or(0);
  c.connection_id = connection_id;
  return c;
}

}  // namespace plexus::transport::internal
