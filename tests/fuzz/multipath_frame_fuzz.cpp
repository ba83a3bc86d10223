// Fuzzes the multipath frame decoder and the receiver's reassembly with arbitrary frame
// sequences: no crash, no overflow, held bytes within the cap, every accepted byte in bounds.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reassembler.hpp"
#include "wire.hpp"

namespace pmi = plexus::multipath::internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kMaxHeld = 1 << 16;
  pmi::Reassembler reassembler(kMaxHeld);
  std::vector<std::vector<uint8_t>> buffers;
  // The input is a series of messages, each prefixed by a 2-byte length; a zero length posts
  // a Recv buffer of the next byte's size instead.
  size_t pos = 0;
  while (pos + 2 <= size) {
    const size_t len = data[pos] | (size_t{data[pos + 1]} << 8);
    pos += 2;
    if (len == 0) {
      if (pos >= size) break;
      buffers.emplace_back(data[pos++] * 16);
      reassembler.PostRecv({buffers.back().data(), buffers.back().size()}, buffers.size());
      continue;
    }
    if (len > size - pos) break;
    auto frame = pmi::DecodeFrame({data + pos, len}, uint64_t{1} << 20);
    if (frame.ok()) {
      bool duplicate = false;
      absl::Status st;
      if (frame->type == pmi::FrameType::kChunk) {
        st =
            reassembler.OnChunk(*frame, {data + pos + pmi::kHeaderSize, frame->length}, &duplicate);
      } else if (frame->type == pmi::FrameType::kNotify) {
        st = reassembler.OnNotify(*frame, &duplicate);
      }
      if (!st.ok()) break;  // the channel fails here
      if (reassembler.held_bytes() > kMaxHeld) __builtin_trap();
      reassembler.TakeCompletions();
    }
    pos += len;
  }
  return 0;
}
