// Little-endian fixed-width encoding helpers for frame headers (x86-64 and arm64 are LE hosts;
// memcpy keeps unaligned access defined).
#pragma once

#include <cstdint>
#include <cstring>

namespace plexus::transport::wire {

class Writer {
 public:
  explicit Writer(uint8_t* out) : p_(out) {}
  void U8(uint8_t v) { *p_++ = v; }
  void U16(uint16_t v) { Put(v); }
  void U32(uint32_t v) { Put(v); }
  void U64(uint64_t v) { Put(v); }
  uint8_t* position() const { return p_; }

 private:
  template <typename T>
  void Put(T v) {
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  uint8_t* p_;
};

class Reader {
 public:
  explicit Reader(const uint8_t* in) : p_(in) {}
  uint8_t U8() { return *p_++; }
  uint16_t U16() { return Get<uint16_t>(); }
  uint32_t U32() { return Get<uint32_t>(); }
  uint64_t U64() { return Get<uint64_t>(); }

 private:
  template <typename T>
  T Get() {
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  const uint8_t* p_;
};

}  // namespace plexus::transport::wire
