// libFuzzer target for the TcpStore frame decoder (libs/transport/src/bootstrap/store_protocol).
// Feeds the input as a byte stream the way the server reads a socket: frame after frame, then
// decodes each body both as a request and as a response. Accepted requests must re-encode to the
// same bytes (the decoder is exact); nothing may crash, read out of bounds or allocate more than
// the frame it was given.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "bootstrap/store_protocol.hpp"

namespace proto = plexus::transport::store_protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small limit on the body so that the fuzzer explores the oversized-frame path too.
  constexpr size_t kFuzzMaxBody = 1 << 16;
  absl::Span<const uint8_t> rest(data, size);
  while (!rest.empty()) {
    auto frame = proto::PeekFrame(rest, kFuzzMaxBody);
    if (!frame.ok() || *frame == 0 || *frame > rest.size()) break;
    const absl::Span<const uint8_t> body =
        rest.subspan(proto::kHeaderBytes, *frame - proto::kHeaderBytes);
    auto request = proto::DecodeRequest(body);
    if (request.ok()) {
      const std::string again = proto::EncodeRequest(*request);
      if (again.size() != *frame ||
          std::memcmp(again.data() + proto::kHeaderBytes, body.data(), body.size()) != 0) {
        std::abort();
      }
    }
    auto response = proto::DecodeResponse(body);
    if (response.ok()) {
      const std::string again = proto::EncodeResponse(*response);
      if (again.size() != *frame) std::abort();
    }
    rest.remove_prefix(*frame);
  }
  // Also the unframed body path, as a client decoding a reply.
  (void)proto::DecodeResponse(absl::MakeConstSpan(data, size));
  (void)proto::DecodeRequest(absl::MakeConstSpan(data, size));
  return 0;
}
