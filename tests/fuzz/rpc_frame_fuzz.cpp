// libFuzzer target: the rpc frame parser and the table-driven message decoder (libs/rpc/src) on
// arbitrary bytes. Every input must give a frame/message or an error; never a crash, an
// out-of-bounds read (ASan) or unbounded memory.
#include <cstdint>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>

#include "codec.hpp"
#include "frame.hpp"

namespace pr = plexus::rpc;
namespace pi = plexus::rpc::internal;

namespace {

struct Node {
  int32_t a = 0;
  bool b = false;
  int32_t e = 0;
  std::string_view s;
  pr::Repeated<int32_t> v;
  pr::Repeated<std::string_view> names;
  const Node* next = nullptr;
  pr::Repeated<Node> kids;
  pr::Optional<int64_t> maybe;
};

const pr::EnumDesc* Enum() {
  static const int32_t values[] = {0, 1, 5};
  static const pr::EnumDesc d{"fuzz.E", values, 3};
  return &d;
}
const pr::MessageDesc* NodeDesc();

#define NODE(m) static_cast<Node*>(m)
#define CNODE(m) static_cast<const Node*>(m)
const pr::MessageDesc* NodeDesc() {
  using K = pr::FieldKind;
  using L = pr::FieldLabel;
  static const pr::FieldDesc fields[] = {
      {"a", 1, K::kInt32, L::kSingular, nullptr, nullptr,
       [](void* m) -> void* { return &NODE(m)->a; }, nullptr, nullptr, nullptr},
      {"b", 2, K::kBool, L::kSingular, nullptr, nullptr,
       [](void* m) -> void* { return &NODE(m)->b; }, nullptr, nullptr, nullptr},
      {"e", 3, K::kEnum, L::kSingular, nullptr, &Enum, [](void* m) -> void* { return &NODE(m)->e; },
       nullptr, nullptr, nullptr},
      {"s", 4, K::kString, L::kSingular, nullptr, nullptr, nullptr, nullptr,
       [](const void* m, const void** d, size_t* n) {
         *d = CNODE(m)->s.data();
         *n = CNODE(m)->s.size();
       },
       [](void* m, const void* d, size_t n) {
         NODE(m)->s = std::string_view(static_cast<const char*>(d), n);
       }},
      {"v", 5, K::kInt32, L::kRepeated, nullptr, nullptr, nullptr, nullptr,
       [](const void* m, const void** d, size_t* n) {
         *d = CNODE(m)->v.data();
         *n = CNODE(m)->v.size();
       },
       [](void* m, const void* d, size_t n) {
         NODE(m)->v = pr::Repeated<int32_t>(static_cast<const int32_t*>(d), n);
       }},
      {"names", 6, K::kString, L::kRepeated, nullptr, nullptr, nullptr, nullptr,
       [](const void* m, const void** d, size_t* n) {
         *d = CNODE(m)->names.data();
         *n = CNODE(m)->names.size();
       },
       [](void* m, const void* d, size_t n) {
         NODE(m)->names =
             pr::Repeated<std::string_view>(static_cast<const std::string_view*>(d), n);
       }},
      {"next", 7, K::kMessage, L::kSingular, &NodeDesc, nullptr, nullptr, nullptr,
       [](const void* m, const void** d, size_t* n) {
         *d = CNODE(m)->next;
         *n = *d ? 1 : 0;
       },
       [](void* m, const void* d, size_t) { NODE(m)->next = static_cast<const Node*>(d); }},
      {"kids", 8, K::kMessage, L::kRepeated, &NodeDesc, nullptr, nullptr, nullptr,
       [](const void* m, const void** d, size_t* n) {
         *d = CNODE(m)->kids.data();
         *n = CNODE(m)->kids.size();
       },
       [](void* m, const void* d, size_t n) {
         NODE(m)->kids = pr::Repeated<Node>(static_cast<const Node*>(d), n);
       }},
      {"maybe", 9, K::kInt64, L::kOptional, nullptr, nullptr,
       [](void* m) -> void* { return &NODE(m)->maybe.value; },
       [](void* m) -> bool* { return &NODE(m)->maybe.has; }, nullptr, nullptr},
  };
  static const pr::MessageDesc d{
      "fuzz.Node", sizeof(Node), alignof(Node), [](void* p) { new (p) Node(); }, fields, 9};
  return &d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The transport hands over 8-aligned receive buffers.
  std::vector<uint64_t> buf(size / 8 + 1);
  if (size) std::memcpy(buf.data(), data, size);
  absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(buf.data()), size);
  auto frame = pi::ParseFrame(bytes);
  if (frame.ok() && !frame->structure.empty()) {
    pi::Arena arena(size_t{16} << 20);
    pi::CodecLimits limits;
    limits.max_arena_bytes = size_t{16} << 20;
    auto m = pi::DecodeMessage(*NodeDesc(), frame->structure, frame->segments, arena, limits);
    if (m.ok()) {
      // Re-encode what was decoded: views must all be readable.
      pi::EncodedMessage enc;
      (void)pi::EncodeMessage(*NodeDesc(), *m, &enc);
    }
  }
  // The same bytes as a batch (several frames back to back), walked as SplitFrames does: every
  // frame's bounds must stay inside the buffer and the walk must end.
  for (size_t at = 0, frames = 0; frames <= size / pi::kFixedHeaderBytes; ++frames) {
    size_t length = 0;
    auto f = pi::ParseFramePrefix(bytes.subspan(at), &length);
    if (!f.ok()) break;
    if (length == 0 || at + length > size) __builtin_trap();
    auto next = pi::NextFrameOffset(at + length, size);
    if (!next.ok() || !next->has_value()) break;
    if (**next <= at || **next % 8 != 0) __builtin_trap();
    at = **next;
  }
  // The structure decoder alone, on the raw input (no frame).
  pi::Arena arena(size_t{16} << 20);
  (void)pi::DecodeMessage(*NodeDesc(), absl::MakeConstSpan(data, size), {}, arena);
  return 0;
}
