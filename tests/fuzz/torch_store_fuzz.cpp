// libFuzzer target for the decoder of torch TCPStore replies (libs/transport/src/bootstrap/
// torch_store_protocol), which reads what torchrun's agent store (or whatever listens at
// MASTER_PORT) sends. The input's first byte picks the reply kind, the rest is the stream. The
// decoder must ask for more bytes until a reply is whole, never want more than the announced
// length allows, never allocate past the cap, and decode the same reply from any longer prefix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "bootstrap/torch_store_protocol.hpp"

namespace ts = plexus::transport::torch_store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  constexpr size_t kFuzzMaxValue = 1 << 12;  // small, so the oversized path is reached
  const auto kind = static_cast<ts::Reply>(data[0] % 3);
  const absl::Span<const uint8_t> stream(data + 1, size - 1);
  // Feed it the way the client reads: what has arrived so far, growing up to what it asks for.
  size_t have = 0;
  while (true) {
    auto d = ts::DecodeReply(kind, stream.subspan(0, have), kFuzzMaxValue);
    if (!d.ok()) return 0;  // an oversized announcement: refused
    if (d->needed > 8 + kFuzzMaxValue) std::abort();
    if (d->complete) {
      if (d->needed > have) std::abort();
      if (kind == ts::Reply::kBytes && d->bytes.size() + 8 != d->needed) std::abort();
      // Extra bytes after the reply change nothing.
      auto again = ts::DecodeReply(kind, stream, kFuzzMaxValue);
      if (!again.ok() || !again->complete || again->needed != d->needed ||
          again->bytes != d->bytes || again->value != d->value || again->byte != d->byte) {
        std::abort();
      }
      return 0;
    }
    if (d->needed <= have) std::abort();      // must ask for more than it has
    if (d->needed > stream.size()) return 0;  // the stream ends first: the client would wait
    have = d->needed;
  }
}
