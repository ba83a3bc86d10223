// Frame headers for the tcp protocol tests (tcp_protocol_test, tcp_state_test).
#pragma once

#include <cstdint>

#include "tcp/frame.hpp"

namespace plexus::testing {

inline transport::internal::tcp::FrameHeader Header(transport::internal::tcp::FrameType type,
                                                    uint64_t length = 0, uint64_t a = 0,
                                                    uint64_t b = 0, uint8_t flags = 0,
                                                    uint32_t immediate = 0) {
  transport::internal::tcp::FrameHeader h;
  h.type = type;
  h.length = length;
  h.a = a;
  h.b = b;
  h.flags = flags;
  h.immediate = immediate;
  return h;
}

}  // namespace plexus::testing
