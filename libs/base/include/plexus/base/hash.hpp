// FNV-1a, 64 bits: a small, stable, non-cryptographic hash of bytes. The same on every host and
// in every build, so it may be stored (file checksums, identities of configurations); it catches
// accidental corruption, not tampering.
//
//   uint64_t h = base::Fnv1a64(header);
//   h = base::Fnv1a64(payload, h);  // continues over a second piece, as over the concatenation
// (raw buffers: std::string_view(reinterpret_cast<const char*>(p), bytes)).
#pragma once

#include <cstdint>
#include <string_view>

namespace plexus::base {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ull;

constexpr uint64_t Fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Offset) {
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * kFnv1a64Prime;
  return h;
}

}  // namespace plexus::base
