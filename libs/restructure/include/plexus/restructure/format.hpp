// The binary form of a Program, for handing programs between processes (a peer may send one).
//
// Little-endian throughout:
//   header:  u32 magic 0x53525850 ("PXRS"), u16 version (1), u8 buffers, u16 steps
//   buffer:  u8 name length, name bytes, u8 dtype (kernels::DataType), u8 role, u64 count
//   step:    u8 op, u8 levels, u8 window_levels, u8 src2 kind (0 none, 1 buffer, 2 scalar),
//            levels x u64 iteration counts, dst access, src1 access,
//            then a src2 access (kind 1) or the scalar's f32 bits as u32 (kind 2)
//   access:  u8 buffer index, i64 base, levels x i64 strides
// Nothing may follow the last step. Counts are checked against the limits of program.hpp
// before anything is allocated, so decoding allocates at most a few hundred KiB.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure {

inline constexpr uint32_t kFormatMagic = 0x53525850;
inline constexpr uint16_t kFormatVersion = 1;

// The encoding of a program that Validate accepts (others encode too, but may not decode).
std::string Serialize(const Program& program);

// The program in `bytes`, validated. DataLoss for malformed bytes (truncation, an unknown magic or
// version, a count beyond its limit, trailing bytes), naming the field and offset;
// InvalidArgument from Validate for a well-formed but unsafe program. Never crashes, loops or
// allocates without bound on any input.
absl::StatusOr<Program> Decode(std::string_view bytes);

// The JSON form, for people and tools:
//   {"buffers": [{"name": "x", "dtype": "f32", "count": 1024, "role": "input"}, ...],
//    "steps": [{"op": "mul", "iters": [32, 32],
//               "dst": {"buffer": "y", "base": 0, "strides": [32, 1]},
//               "src1": {"buffer": "x", "base": 0, "strides": [1, 32]},
//               "scalar": 0.5, "scalar_bits": 1056964608}, ...]}
// dtypes as kernels::DataTypeName, ops as OpName, roles as RoleName; a binary op has "src2" (an
// access) or "scalar" (its value; "scalar_bits", the f32's bits, wins when both are given and
// is what ProgramToJson writes beside it, so that every float round-trips); "window_levels" for
// maxpool. ProgramFromJson(ProgramToJson(p)) == p for a valid p.
std::string ProgramToJson(const Program& program);
// The program in JSON `text`, validated. InvalidArgument naming the field ("steps[2].src1.buffer:
// no buffer named 'spectrum'") or Validate's error. Never crashes on any input.
absl::StatusOr<Program> ProgramFromJson(std::string_view text);

}  // namespace plexus::restructure
