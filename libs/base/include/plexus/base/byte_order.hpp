// Little-endian fixed-width integers in byte buffers: the one encoding every Plexus frame header
// uses (tcp, shm and verbs frames, collectives call headers, rpc frames and messages, parameter
// server and multipath frames, the torch store protocol). Reads and writes go through memcpy, so
// unaligned positions are defined; on a big-endian host the bytes are swapped.
//
//   uint8_t header[16];
//   base::ByteWriter w(header);
//   w.Put<uint32_t>(kMagic);
//   w.Put<uint64_t>(sequence);
//   base::ByteReader r(header);
//   if (r.Get<uint32_t>() != kMagic) ...
//
// ByteReader and ByteWriter do not check bounds: callers check a frame's length once, before
// decoding its fields. Bytes whose length says nothing yet (a variable-length body, a value from
// a store) are read with CheckedByteReader, which checks every read.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace plexus::base {

namespace internal {
template <typename T>
constexpr T ToLittleEndian(T v) {
  static_assert(std::is_integral_v<T>, "byte_order: integers only (cast enums and floats)");
  if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
    return v;
  } else {
    using U = std::make_unsigned_t<T>;
    U u = static_cast<U>(v), out = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      out = static_cast<U>((out << 8) | ((u >> (8 * i)) & 0xff));
    return static_cast<T>(out);
  }
}
}  // namespace internal

// Writes `v` at `out` (sizeof(T) bytes).
template <typename T>
inline void StoreLittleEndian(uint8_t* out, T v) {
  v = internal::ToLittleEndian(v);
  std::memcpy(out, &v, sizeof v);
}

// Reads a T from the sizeof(T) bytes at `in`.
template <typename T>
inline T LoadLittleEndian(const uint8_t* in) {
  T v;
  std::memcpy(&v, in, sizeof v);
  return internal::ToLittleEndian(v);
}

// Host-order values at unaligned positions of element buffers (the data a kernel reduces or
// converts, never a wire field): memcpy, no byte swap.
template <typename T>
inline T LoadHostOrder(const uint8_t* in) {
  T v;
  std::memcpy(&v, in, sizeof v);
  return v;
}
template <typename T>
inline void StoreHostOrder(uint8_t* out, T v) {
  std::memcpy(out, &v, sizeof v);
}

// Appends `v` to a byte string.
template <typename T>
inline void AppendLittleEndian(std::string& out, T v) {
  v = internal::ToLittleEndian(v);
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Sequential writer over a buffer the caller sized.
class ByteWriter {
 public:
  explicit ByteWriter(uint8_t* out) : p_(out) {}
  template <typename T>
  void Put(T v) {
    StoreLittleEndian<T>(p_, v);
    p_ += sizeof(T);
  }
  void U8(uint8_t v) { Put(v); }
  void U16(uint16_t v) { Put(v); }
  void U32(uint32_t v) { Put(v); }
  void U64(uint64_t v) { Put(v); }
  uint8_t* position() const { return p_; }

 private:
  uint8_t* p_;
};

// Sequential reader over bytes whose length the caller checked.
class ByteReader {
 public:
  explicit ByteReader(const uint8_t* in) : p_(in) {}
  template <typename T>
  T Get() {
    T v = LoadLittleEndian<T>(p_);
    p_ += sizeof(T);
    return v;
  }
  uint8_t U8() { return Get<uint8_t>(); }
  uint16_t U16() { return Get<uint16_t>(); }
  uint32_t U32() { return Get<uint32_t>(); }
  uint64_t U64() { return Get<uint64_t>(); }
  const uint8_t* position() const { return p_; }

 private:
  const uint8_t* p_;
};

// Sequential reader over bytes of untrusted content: every read checks what is left, and the
// first failure sticks (later reads return false too), so a decoder reads field after field and
// looks at ok() / error() once at the end.
//
//   base::CheckedByteReader r(body);
//   uint32_t count = 0;
//   std::string_view name;
//   if (r.U32(&count) && r.Bytes(count, &name)) ...
//   if (!r.ok()) return Malformed(r.error());
class CheckedByteReader {
 public:
  CheckedByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit CheckedByteReader(std::string_view bytes)
      : CheckedByteReader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) {}

  template <typename T>
  bool Get(T* out) {
    if (!Need(sizeof(T))) return false;
    *out = LoadLittleEndian<T>(data_ + offset_);
    offset_ += sizeof(T);
    return true;
  }
  bool U8(uint8_t* v) { return Get(v); }
  bool U16(uint16_t* v) { return Get(v); }
  bool U32(uint32_t* v) { return Get(v); }
  bool U64(uint64_t* v) { return Get(v); }
  bool I64(int64_t* v) { return Get(v); }
  // The next `n` bytes, in place (valid while the underlying bytes are).
  bool Bytes(size_t n, std::string_view* out) {
    if (!Need(n)) return false;
    *out = std::string_view(reinterpret_cast<const char*>(data_ + offset_), n);
    offset_ += n;
    return true;
  }

  // Records `error` unless an earlier one is recorded; returns false (for `return r.Fail(...)`).
  bool Fail(std::string error) {
    if (error_.empty()) error_ = std::move(error);
    return false;
  }
  bool ok() const { return error_.empty(); }
  // The first failure: "truncated: needs 4 more bytes at offset 9, has 2", or one from Fail().
  const std::string& error() const { return error_; }
  size_t offset() const { return offset_; }
  size_t remaining() const { return size_ - offset_; }

 private:
  bool Need(size_t n) {
    if (!error_.empty()) return false;
    if (remaining() >= n) return true;
    return Fail("truncated: needs " + std::to_string(n) + " more bytes at offset " +
                std::to_string(offset_) + ", has " + std::to_string(remaining()));
  }

  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
  std::string error_;
};

}  // namespace plexus::base
