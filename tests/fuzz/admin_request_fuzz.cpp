// libFuzzer target: the admin endpoint's request decoder (libs/base/src/admin.cpp) on arbitrary
// bytes. Every input must decode or give an error; never a crash, a throw, deep recursion or an
// out-of-bounds read (ASan). What decodes must survive an encode/decode round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "plexus/base/admin.hpp"

namespace admin = plexus::base::admin;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<admin::AdminRequest> r = admin::DecodeRequest(body);
  if (!r.ok()) return 0;
  absl::StatusOr<admin::AdminRequest> again = admin::DecodeRequest(admin::EncodeRequest(*r));
  // Invalid UTF-8 is replaced when encoding, so only valid text is compared exactly.
  if (!again.ok() || again->command != r->command) std::abort();
  return 0;
}
