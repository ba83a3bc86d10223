// A client that speaks the rpc wire protocol on a bare transport connection, for the tests of
// hostile and idle clients: the handshake is done properly, then the test sends what it likes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "frame.hpp"
#include "kinds.plexus.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::rpctest {

// The hello frame of a client of the Kinds service.
inline void BuildKindsHello(rpc::internal::OutFrame* hello) {
  rpc::internal::FrameHeader h;
  h.type = rpc::internal::FrameType::kHello;
  const std::vector<std::pair<std::string, std::string>> md = {
      {Kinds::Descriptor().full_name, absl::StrFormat("%016x", Kinds::Descriptor().schema_hash)}};
  rpc::internal::BuildFrame(h, "", md, nullptr, hello);
}

// Sends the hello on `conn` (its completions go to `cq`, shared with nothing else meanwhile) and
// waits for the hello's send and the server's answer, whose status it returns (the refusal
// the server sent, or the transport's error). `ack` receives the answer and must stay alive
// until the connection is closed.
inline absl::Status RawHandshake(transport::Connection& conn, transport::CompletionQueue& cq,
                                 std::vector<uint8_t>& ack,
                                 absl::Duration timeout = absl::Seconds(10)) {
  rpc::internal::OutFrame hello;
  BuildKindsHello(&hello);
  ack.resize(4096);
  if (absl::Status st = conn.PostRecv({ack.data(), ack.size()}, 1); !st.ok()) return st;
  if (absl::Status st = conn.PostSend(hello.parts, 2); !st.ok()) return st;
  size_t ack_bytes = 0;
  for (int got = 0; got < 2; ++got) {
    auto c = cq.Wait(timeout);
    if (!c.ok()) return c.status();
    if (!c->status.ok()) return c->status;
    if (c->wr_id == 1) ack_bytes = c->bytes;
  }
  auto frame = rpc::internal::ParseFrame({ack.data(), ack_bytes}, {});
  if (!frame.ok()) return frame.status();
  if (frame->header.status_code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(frame->header.status_code),
                        std::string(frame->status_message));
  }
  return absl::OkStatus();
}

}  // namespace plexus::rpctest
