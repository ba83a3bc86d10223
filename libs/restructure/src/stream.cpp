#include "plexus/restructure/stream.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "passes.hpp"
#include "plexus/base/status.hpp"

namespace plexus::restructure {
namespace {

using internal::Pass;

// Whether `a` walks its buffer's first points(iters) elements in the nest's row-major order.
bool InOrder(const Access& a, const std::vector<int64_t>& iters) {
  if (a.base != 0) return false;
  int64_t below = 1;
  for (size_t l = iters.size(); l-- > 0;) {
    if (iters[l] > 1 && a.strides[l] != below) return false;
    below *= iters[l];
  }
  return true;
}

int64_t Points(const Pass& pass) {
  int64_t n = 1;
  for (int64_t i : pass.iters) n *= i;
  return n;
}

std::string Name(const Program& p, int buffer) { return "'" + p.buffers[buffer].name + "'"; }

absl::Status NotStreamable(std::string why) {
  return absl::FailedPreconditionError(absl::StrCat("the program does not stream: ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<OutputStream>> OutputStream::Create(const Executor& executor,
                                                                   std::vector<ConstBytes> inputs) {
  const Program& p = executor.program_;
  const std::vector<Pass>& passes = executor.passes_;
  int out = -1, outputs = 0;
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    if (p.buffers[b].role == Role::kOutput) {
      out = static_cast<int>(b);
      ++outputs;
    }
  }
  if (outputs != 1) return NotStreamable(absl::StrCat(outputs, " outputs (one streams)"));
  if (passes.empty() || passes.back().kind != Pass::Kind::kFused) {
    return NotStreamable(
        absl::StrCat("output ", Name(p, out), " is not written by a fused element-wise pass"));
  }
  for (size_t i = 0; i + 1 < passes.size(); ++i) {
    for (const Step& s : passes[i].steps) {
      if (s.dst.buffer == out) {
        return NotStreamable(
            absl::StrCat("output ", Name(p, out), " is written by pass ", i, ", not the last"));
      }
    }
  }
  const Pass& last = passes.back();
  int stores = 0;
  for (size_t s = 0; s < last.steps.size(); ++s) {
    const Step& st = last.steps[s];
    if (last.store[s]) {
      ++stores;
      if (!InOrder(st.dst, last.iters) || Points(last) != p.buffers[out].count) {
        return NotStreamable(absl::StrCat("output ", Name(p, out), " is not written in order"));
      }
    }
    if ((st.src1.buffer == out && last.forward1[s] < 0) ||
        (st.src2_kind == Operand2::kBuffer && st.src2.buffer == out && last.forward2[s] < 0)) {
      return NotStreamable(absl::StrCat("output ", Name(p, out), " is read back"));
    }
  }
  if (stores != 1) return NotStreamable("the last pass stores more than the output");
  auto bound = std::make_shared<internal::BoundBuffers>();
  const std::vector<bool> needed = executor.NeededScratch();
  const MutableBytes none[1] = {};
  PLEXUS_RETURN_IF_ERROR(internal::BindBuffers(p, inputs, none, bound.get(), &needed, out));
  const internal::Memory mem{bound->bufs, executor.virtual_};
  for (size_t i = 0; i + 1 < passes.size(); ++i) executor.RunPass(i, mem);
  std::unique_ptr<OutputStream> s(new OutputStream());
  s->executor_ = &executor;
  s->inputs_ = std::move(inputs);
  s->bound_ = std::move(bound);
  s->output_ = out;
  s->element_ = kernels::DataTypeSize(p.buffers[out].dtype);
  s->bytes_ = static_cast<size_t>(p.buffers[out].count) * s->element_;
  return s;
}

absl::Status OutputStream::Produce(size_t offset, absl::Span<uint8_t> out) {
  const size_t n = out.size();
  if (offset > bytes_ || n > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("OutputStream::Produce: bytes [", offset, ", +", n,
                                              ") of an output of ", bytes_, " bytes"));
  }
  if (n == 0) return absl::OkStatus();
  const auto& bound = *static_cast<internal::BoundBuffers*>(bound_.get());
  const Pass& last = executor_->passes_.back();
  const size_t el = element_;
  auto run = [&](int64_t first, int64_t count, uint8_t* to) {
    internal::Memory mem{bound.bufs, executor_->virtual_};
    mem.window = output_;
    mem.window_first = first;
    mem.window_write = to;
    internal::RunFused(last, mem, first, first + count);
  };
  size_t done = 0;
  if (offset % el != 0) {  // the head: part of one element
    edge_.resize(el);
    run(static_cast<int64_t>(offset / el), 1, edge_.data());
    const size_t take = std::min(el - offset % el, n);
    std::memcpy(out.data(), edge_.data() + offset % el, take);
    done = take;
  }
  const size_t whole = (n - done) / el;
  if (whole > 0) {
    run(static_cast<int64_t>((offset + done) / el), static_cast<int64_t>(whole), out.data() + done);
    done += whole * el;
  }
  if (done < n) {  // the tail: the start of one element
    edge_.resize(el);
    run(static_cast<int64_t>((offset + done) / el), 1, edge_.data());
    std::memcpy(out.data() + done, edge_.data(), n - done);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<InputStream>> InputStream::Create(
    const Executor& executor, int input, std::vector<ConstBytes> other_inputs,
    std::vector<MutableBytes> outputs) {
  const Program& p = executor.program_;
  const std::vector<Pass>& passes = executor.passes_;
  int in = -1, k = 0;
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    if (p.buffers[b].role == Role::kInput && k++ == input) in = static_cast<int>(b);
  }
  if (in < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("InputStream: input ", input, " of a program with ", k, " inputs"));
  }
  if (passes.size() != 1 || passes[0].kind != Pass::Kind::kFused) {
    return NotStreamable(
        absl::StrCat(passes.size(), " passes (one fused element-wise pass streams)"));
  }
  const Pass& pass = passes[0];
  if (Points(pass) != p.buffers[in].count) {
    return NotStreamable(absl::StrCat("input ", Name(p, in), " is not read once per point"));
  }
  for (size_t s = 0; s < pass.steps.size(); ++s) {
    const Step& st = pass.steps[s];
    const bool bad1 = st.src1.buffer == in && pass.forward1[s] < 0 && !InOrder(st.src1, pass.iters);
    const bool bad2 = st.src2_kind == Operand2::kBuffer && st.src2.buffer == in &&
                      pass.forward2[s] < 0 && !InOrder(st.src2, pass.iters);
    if (bad1 || bad2)
      return NotStreamable(absl::StrCat("input ", Name(p, in), " is not read in order"));
  }
  for (const auto& v : executor.virtual_) {
    for (const auto& g : v.segments) {
      if (v.active && g.source == in) {
        return NotStreamable(absl::StrCat("input ", Name(p, in), " is read through a copy"));
      }
    }
  }
  std::vector<ConstBytes> inputs = std::move(other_inputs);
  if (static_cast<int>(inputs.size()) + 1 != k) {
    return absl::InvalidArgumentError(absl::StrCat("InputStream: ", inputs.size(),
                                                   " other inputs given, the program has ", k - 1));
  }
  inputs.insert(inputs.begin() + input, ConstBytes());
  auto bound = std::make_shared<internal::BoundBuffers>();
  const std::vector<bool> needed = executor.NeededScratch();
  PLEXUS_RETURN_IF_ERROR(internal::BindBuffers(p, inputs, outputs, bound.get(), &needed, in));
  std::unique_ptr<InputStream> s(new InputStream());
  s->executor_ = &executor;
  s->bound_ = std::move(bound);
  s->input_ = in;
  s->element_ = kernels::DataTypeSize(p.buffers[in].dtype);
  s->bytes_ = static_cast<size_t>(p.buffers[in].count) * s->element_;
  return s;
}

absl::Status InputStream::Consume(size_t offset, absl::Span<const uint8_t> in) {
  const size_t n = in.size();
  if (offset != consumed_) {
    return absl::InvalidArgumentError(absl::StrCat("InputStream::Consume: bytes from ", offset,
                                                   " after ", consumed_, " were consumed"));
  }
  if (n > bytes_ - consumed_) {
    return absl::OutOfRangeError(
        absl::StrCat("InputStream::Consume: ", consumed_ + n, " bytes of an input of ", bytes_));
  }
  const auto& bound = *static_cast<internal::BoundBuffers*>(bound_.get());
  const Pass& pass = executor_->passes_[0];
  const size_t el = element_;
  auto run = [&](int64_t first, int64_t count, const uint8_t* from) {
    internal::Memory mem{bound.bufs, executor_->virtual_};
    mem.window = input_;
    mem.window_first = first;
    mem.window_read = from;
    internal::RunFused(pass, mem, first, first + count);
  };
  size_t done = 0;
  int64_t next = static_cast<int64_t>(consumed_ / el);
  if (!carry_.empty()) {  // finish the element the previous piece began
    const size_t take = std::min(el - carry_.size(), n);
    carry_.insert(carry_.end(), in.data(), in.data() + take);
    done = take;
    if (carry_.size() == el) {
      run(next++, 1, carry_.data());
      carry_.clear();
    }
  }
  const size_t whole = (n - done) / el;
  if (whole > 0) {
    run(next, static_cast<int64_t>(whole), in.data() + done);
    done += whole * el;
  }
  carry_.insert(carry_.end(), in.data() + done, in.data() + n);
  consumed_ += n;
  return absl::OkStatus();
}

absl::Status InputStream::Finish() const {
  if (consumed_ == bytes_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("InputStream: ", bytes_ - consumed_, " of ",
                                                    bytes_, " input bytes never arrived"));
}

}  // namespace plexus::restructure
