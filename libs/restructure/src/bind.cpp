#include "bind.hpp"

#include <new>
#include <string>

#include "absl/strings/str_cat.h"

namespace plexus::restructure::internal {
namespace {

bool Overlap(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + nb && y < x + na;
}

}  // namespace

absl::Status BindBuffers(const Program& program, absl::Span<const ConstBytes> inputs,
                         absl::Span<const MutableBytes> outputs, BoundBuffers* out,
                         const std::vector<bool>* scratch_needed, int unbound) {
  out->bufs.assign(program.buffers.size(), Bound{});
  out->scratch.clear();
  out->scratch.reserve(program.buffers.size());
  size_t next_in = 0, next_out = 0;
  size_t declared_in = 0, declared_out = 0;
  for (const BufferDecl& b : program.buffers) {
    declared_in += b.role == Role::kInput;
    declared_out += b.role == Role::kOutput;
  }
  if (inputs.size() != declared_in || outputs.size() != declared_out) {
    return absl::InvalidArgumentError(absl::StrCat("program declares ", declared_in, " inputs and ",
                                                   declared_out, " outputs; given ", inputs.size(),
                                                   " and ", outputs.size()));
  }
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const BufferDecl& b = program.buffers[i];
    Bound& bound = out->bufs[i];
    bound.dtype = b.dtype;
    bound.size = kernels::DataTypeSize(b.dtype);
    const size_t bytes = static_cast<size_t>(b.count) * bound.size;
    if (b.role == Role::kScratch && scratch_needed != nullptr && !(*scratch_needed)[i]) continue;
    if (b.role == Role::kScratch) {
      try {
        out->scratch.emplace_back(bytes, 0);
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError(
            absl::StrCat("scratch '", b.name, "': cannot allocate ", bytes, " bytes"));
      }
      bound.write = out->scratch.back().data();
      bound.read = bound.write;
      continue;
    }
    if (static_cast<int>(i) == unbound) {  // its memory comes piece by piece (a stream's window)
      (b.role == Role::kInput ? next_in : next_out)++;
      continue;
    }
    const size_t given = b.role == Role::kInput ? inputs[next_in].size() : outputs[next_out].size();
    if (given != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(RoleName(b.role)), " '", b.name, "': ", given, " bytes given, declared ",
          b.count, " ", std::string(kernels::DataTypeName(b.dtype)), " elements = ", bytes,
          " bytes"));
    }
    if (b.role == Role::kInput) {
      bound.read = inputs[next_in++].data();
    } else {
      bound.write = outputs[next_out++].data();
      bound.read = bound.write;
    }
  }
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    if (program.buffers[i].role != Role::kOutput || static_cast<int>(i) == unbound) continue;
    const size_t ni = static_cast<size_t>(program.buffers[i].count) * out->bufs[i].size;
    for (size_t j = 0; j < program.buffers.size(); ++j) {
      if (j == i || program.buffers[j].role == Role::kScratch || static_cast<int>(j) == unbound) {
        continue;
      }
      const size_t nj = static_cast<size_t>(program.buffers[j].count) * out->bufs[j].size;
      if (Overlap(out->bufs[i].read, ni, out->bufs[j].read, nj)) {
        return absl::InvalidArgumentError(
            absl::StrCat("output '", program.buffers[i].name, "' overlaps ",
                         std::string(RoleName(program.buffers[j].role)), " '",
                         program.buffers[j].name, "' in memory"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace plexus::restructure::internal
