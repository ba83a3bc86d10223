#include "plexus/restructure/format.hpp"

#include <bit>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"

namespace plexus::restructure {
namespace {

void PutAccess(std::string& out, const Access& a) {
  base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(a.buffer));
  base::AppendLittleEndian<int64_t>(out, a.base);
  for (int64_t s : a.strides) base::AppendLittleEndian<int64_t>(out, s);
}

class Decoder {
 public:
  explicit Decoder(std::string_view bytes) : r_(bytes) {}

  absl::StatusOr<Program> Run() {
    uint32_t magic = 0;
    uint16_t version = 0, steps = 0;
    uint8_t buffers = 0;
    if (r_.U32(&magic) && magic != kFormatMagic) return Malformed("not a restructure program");
    if (r_.U16(&version) && version != kFormatVersion) {
      return Malformed(
          absl::StrCat("version ", version, " (this build reads ", kFormatVersion, ")"));
    }
    if (r_.U8(&buffers) && buffers > kMaxBuffers) {
      return Malformed(absl::StrCat(buffers, " buffers (limit ", kMaxBuffers, ")"));
    }
    if (r_.U16(&steps) && steps > kMaxSteps) {
      return Malformed(absl::StrCat(steps, " steps (limit ", kMaxSteps, ")"));
    }
    if (!r_.ok()) return Malformed("header");
    Program p;
    p.buffers.resize(buffers);
    for (size_t b = 0; b < p.buffers.size(); ++b) {
      if (!ReadBuffer(&p.buffers[b])) return Malformed(absl::StrCat("buffer ", b));
    }
    p.steps.resize(steps);
    for (size_t s = 0; s < p.steps.size(); ++s) {
      if (!ReadStep(&p.steps[s])) return Malformed(absl::StrCat("step ", s));
    }
    if (r_.remaining() != 0) {
      return Malformed(absl::StrCat(r_.remaining(), " bytes after the last step"));
    }
    if (absl::Status s = Validate(p); !s.ok()) return s;
    return p;
  }

 private:
  absl::Status Malformed(std::string_view where) {
    std::string message = absl::StrCat("restructure program: ", std::string(where));
    if (!r_.ok()) absl::StrAppend(&message, ": ", r_.error());
    return absl::DataLossError(absl::StrCat(message, " (offset ", r_.offset(), ")"));
  }

  bool ReadBuffer(BufferDecl* d) {
    uint8_t len = 0, dtype = 0, role = 0;
    uint64_t count = 0;
    std::string_view name;
    if (r_.U8(&len) && len > kMaxNameBytes) {
      return r_.Fail(absl::StrCat("name of ", len, " bytes (limit ", kMaxNameBytes, ")"));
    }
    if (!r_.Bytes(len, &name) || !r_.U8(&dtype) || !r_.U8(&role) || !r_.U64(&count)) return false;
    if (dtype >= kernels::kNumDataTypes) return r_.Fail(absl::StrCat("unknown dtype ", dtype));
    if (role > static_cast<uint8_t>(Role::kScratch)) {
      return r_.Fail(absl::StrCat("unknown role ", role));
    }
    d->name = std::string(name);
    d->dtype = static_cast<DataType>(dtype);
    d->role = static_cast<Role>(role);
    d->count = static_cast<int64_t>(count);
    return true;
  }

  bool ReadAccess(size_t levels, Access* a) {
    uint8_t buffer = 0;
    if (!r_.U8(&buffer) || !r_.I64(&a->base)) return false;
    a->buffer = buffer;
    a->strides.resize(levels);
    for (int64_t& s : a->strides) {
      if (!r_.I64(&s)) return false;
    }
    return true;
  }

  bool ReadStep(Step* s) {
    uint8_t op = 0, levels = 0, window = 0, kind = 0;
    if (!r_.U8(&op) || !r_.U8(&levels) || !r_.U8(&window) || !r_.U8(&kind)) return false;
    if (op >= kNumOps) return r_.Fail(absl::StrCat("unknown op ", op));
    if (levels > kMaxLevels) {
      return r_.Fail(absl::StrCat(levels, " levels (limit ", kMaxLevels, ")"));
    }
    if (kind > static_cast<uint8_t>(Operand2::kScalar)) {
      return r_.Fail(absl::StrCat("unknown src2 kind ", kind));
    }
    s->op = static_cast<Op>(op);
    s->window_levels = window;
    s->src2_kind = static_cast<Operand2>(kind);
    s->iters.resize(levels);
    for (int64_t& it : s->iters) {
      uint64_t v = 0;
      if (!r_.U64(&v)) return false;
      it = static_cast<int64_t>(v);
    }
    if (!ReadAccess(levels, &s->dst) || !ReadAccess(levels, &s->src1)) return false;
    if (s->src2_kind == Operand2::kBuffer) return ReadAccess(levels, &s->src2);
    if (s->src2_kind == Operand2::kScalar) {
      uint32_t bits = 0;
      if (!r_.U32(&bits)) return false;
      s->scalar = std::bit_cast<float>(bits);
    }
    return true;
  }

  base::CheckedByteReader r_;
};

}  // namespace

std::string Serialize(const Program& program) {
  std::string out;
  base::AppendLittleEndian<uint32_t>(out, kFormatMagic);
  base::AppendLittleEndian<uint16_t>(out, kFormatVersion);
  base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(program.buffers.size()));
  base::AppendLittleEndian<uint16_t>(out, static_cast<uint16_t>(program.steps.size()));
  for (const BufferDecl& b : program.buffers) {
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(b.name.size()));
    out += b.name;
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(b.dtype));
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(b.role));
    base::AppendLittleEndian<uint64_t>(out, static_cast<uint64_t>(b.count));
  }
  for (const Step& s : program.steps) {
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(s.op));
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(s.iters.size()));
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(s.window_levels));
    base::AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(s.src2_kind));
    for (int64_t it : s.iters) base::AppendLittleEndian<uint64_t>(out, static_cast<uint64_t>(it));
    PutAccess(out, s.dst);
    PutAccess(out, s.src1);
    if (s.src2_kind == Operand2::kBuffer) PutAccess(out, s.src2);
    if (s.src2_kind == Operand2::kScalar) {
      base::AppendLittleEndian<uint32_t>(out, std::bit_cast<uint32_t>(s.scalar));
    }
  }
  return out;
}

absl::StatusOr<Program> Decode(std::string_view bytes) { return Decoder(bytes).Run(); }

}  // namespace plexus::restructure
