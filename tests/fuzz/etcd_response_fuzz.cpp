// libFuzzer target for what EtcdStore reads from etcd (libs/transport/src/bootstrap/
// etcd_protocol): HTTP/1.1 responses fed in pieces split where the input says (Content-Length
// and chunked bodies, interim responses, limits), and the JSON answers the store decodes. No
// crash, no unbounded allocation; a body never exceeds its limit.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bootstrap/etcd_protocol.hpp"

namespace etcd = plexus::transport::etcd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  etcd::ResponseParser parser;
  size_t at = 0;
  while (at < text.size() && !parser.done()) {
    const std::string_view chunk(text.data() + at, std::min(piece, text.size() - at));
    auto used = parser.Feed(absl::string_view(chunk.data(), chunk.size()));
    if (!used.ok()) break;
    if (*used > chunk.size()) std::abort();
    at += *used;
    if (*used < chunk.size()) break;  // bytes after the response
  }
  if (parser.body().size() > etcd::kMaxResponseBytes) std::abort();
  if (parser.done()) {
    auto j = etcd::ParseBody(parser.body(), parser.status(), "fuzz");
    if (j.ok()) {
      (void)etcd::ParseRange(*j);
      (void)etcd::ParseTxnSucceeded(*j);
      (void)etcd::ParseDeleted(*j);
      (void)etcd::ParseLease(*j);
    }
  }
  // The body alone, as JSON.
  auto j = etcd::ParseBody(text, 200, "fuzz");
  if (j.ok()) {
    auto kv = etcd::ParseRange(*j);
    (void)kv;
    (void)etcd::ParseLease(*j);
  }
  return 0;
}
