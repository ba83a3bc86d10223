// Arbitrary bytes through the restructure program decoder (plexus/restructure/format.hpp): no
// crash, hang or unbounded allocation; a program that decodes is valid, re-encodes to the same
// bytes, and runs on zero-filled buffers of its declared sizes (when small enough to run here).
// Each input is tried raw, behind a valid header, and as the seed of a small structured program;
// the JSON decoder likewise (raw bytes, and the structured program's JSON).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/base/byte_order.hpp"
#include "plexus/restructure/format.hpp"
#include "plexus/restructure/interpreter.hpp"

namespace pr = plexus::restructure;

namespace {

// Bounds on what this harness runs (the decoder's own limits allow far larger programs).
constexpr int64_t kRunIterations = int64_t{1} << 20;
constexpr int64_t kRunBytes = int64_t{16} << 20;

void Check(std::string_view bytes) {
  absl::StatusOr<pr::Program> p = pr::Decode(bytes);
  if (!p.ok()) return;
  if (!pr::Validate(*p).ok() || pr::Serialize(*p) != bytes) std::abort();
  const pr::ProgramSize size = pr::MeasureProgram(*p);
  if (size.iterations > kRunIterations ||
      size.input_bytes + size.output_bytes + size.scratch_bytes > kRunBytes) {
    return;
  }
  std::vector<std::vector<uint8_t>> in, out;
  for (const pr::BufferDecl& b : p->buffers) {
    const size_t n = static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype);
    if (b.role == pr::Role::kInput) in.emplace_back(n, 0);
    if (b.role == pr::Role::kOutput) out.emplace_back(n, 0);
  }
  std::vector<pr::ConstBytes> ins(in.begin(), in.end());
  std::vector<pr::MutableBytes> outs;
  for (auto& v : out) outs.emplace_back(v.data(), v.size());
  if (!pr::Interpret(*p, ins, outs).ok()) std::abort();
}

// Reads small values from the fuzz input (0 once exhausted).
struct Reader {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  int Next(int mod) { return at < size ? data[at++] % mod : 0; }
};

// A program of small random shapes, mostly close to valid, so that the validator's refusals and
// the interpreter's loops are reached far more often than by raw bytes.
pr::Program Structured(Reader& r) {
  pr::Program p;
  const int buffers = 1 + r.Next(4);
  for (int b = 0; b < buffers; ++b) {
    p.buffers.push_back({std::string(1, static_cast<char>('a' + b)),
                         static_cast<pr::DataType>(r.Next(plexus::kernels::kNumDataTypes)),
                         1 + r.Next(64), static_cast<pr::Role>(r.Next(3))});
  }
  const int steps = 1 + r.Next(4);
  for (int s = 0; s < steps; ++s) {
    pr::Step st;
    st.op = static_cast<pr::Op>(r.Next(pr::kNumOps));
    const int levels = 1 + r.Next(3);
    for (int l = 0; l < levels; ++l) st.iters.push_back(1 + r.Next(8));
    auto access = [&] {
      pr::Access a{r.Next(buffers), r.Next(64), {}};
      for (int l = 0; l < levels; ++l) a.strides.push_back(r.Next(17) - 8);
      return a;
    };
    st.dst = access();
    st.src1 = access();
    if (pr::IsBinary(st.op)) {
      st.src2_kind = r.Next(2) ? pr::Operand2::kBuffer : pr::Operand2::kScalar;
      if (st.src2_kind == pr::Operand2::kBuffer) st.src2 = access();
      if (st.src2_kind == pr::Operand2::kScalar) st.scalar = static_cast<float>(r.Next(9)) - 4.5f;
    }
    if (st.op == pr::Op::kMaxPool) st.window_levels = 1 + r.Next(levels);
    p.steps.push_back(st);
  }
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  Check(raw);
  // The same bytes behind a valid magic and version, so that mutations reach the body.
  std::string framed;
  plexus::base::AppendLittleEndian<uint32_t>(framed, pr::kFormatMagic);
  plexus::base::AppendLittleEndian<uint16_t>(framed, pr::kFormatVersion);
  framed.append(raw);
  Check(framed);
  // A structured program, through its encoding.
  Reader r{data, size};
  const pr::Program structured = Structured(r);
  Check(pr::Serialize(structured));
  // The JSON form: raw bytes, and the structured program's JSON. What parses is valid and
  // comes back the same through JSON and through the binary form.
  for (const std::string& text : {std::string(raw), pr::ProgramToJson(structured)}) {
    absl::StatusOr<pr::Program> p = pr::ProgramFromJson(text);
    if (!p.ok()) continue;
    if (!pr::Validate(*p).ok()) std::abort();
    absl::StatusOr<pr::Program> again = pr::ProgramFromJson(pr::ProgramToJson(*p));
    if (!again.ok() || !(*again == *p)) std::abort();
    Check(pr::Serialize(*p));
  }
  return 0;
}
