// A program run a piece at a time while its data moves: restructuring fused with a send or a
// receive, with no buffer of the message's size between the user's memory and the wire.
// plexus::transport's Connection::PostSendProduced and PostRecvConsumed take these streams'
// Produce and Consume as their producer and consumer (the transport knows nothing of programs):
//
//   auto out = OutputStream::Create(executor, {input});          // sender: program -> wire
//   conn->PostSendProduced(out->bytes(), [&](size_t off, absl::Span<uint8_t> b) {
//     return out->Produce(off, b); }, wr_id);
//   auto in = InputStream::Create(executor, 0, {}, {output});     // receiver: wire -> program
//   conn->PostRecvConsumed(in->bytes(), [&](size_t off, absl::Span<const uint8_t> b) {
//     return in->Consume(off, b); }, wr_id);
//
// Results are the executor's (executor.hpp), bit for bit. A stream keeps a pointer to its
// executor and the memory given to Create: they must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "plexus/restructure/executor.hpp"

namespace plexus::restructure {

// The program's one output made a byte range at a time from inputs in memory (a produced send).
// The output must be written by the program's last pass only, a fused pass that stores it in the
// order of its points (the pass's nest walks the output contiguously); earlier passes (a max
// pooling into scratch) run once, in Create. FailedPrecondition naming what does not stream.
class OutputStream {
 public:
  static absl::StatusOr<std::unique_ptr<OutputStream>> Create(const Executor& executor,
                                                              std::vector<ConstBytes> inputs);
  // Bytes of the output: the message's length.
  size_t bytes() const { return bytes_; }
  // Writes output bytes [offset, offset + out.size()); any order, pieces may split elements.
  // OutOfRange past the end.
  absl::Status Produce(size_t offset, absl::Span<uint8_t> out);

 private:
  OutputStream() = default;
  const Executor* executor_ = nullptr;
  std::vector<ConstBytes> inputs_;
  std::shared_ptr<void> bound_;  // the bound buffers (internal::BoundBuffers)
  int output_ = -1;              // the output's buffer index
  size_t element_ = 0, bytes_ = 0;
  std::vector<uint8_t> edge_;  // whole elements around a piece's split ones
};

// One input arriving a byte range at a time, in order (a consumed receive): the elements each
// piece completes are restructured into the outputs at once. The program must be one fused pass
// that reads the streamed input in the order of its points (point i needs input element i
// only). `input` is the streamed input's position among the inputs; `other_inputs` are the
// others, in order. FailedPrecondition naming what does not stream.
class InputStream {
 public:
  static absl::StatusOr<std::unique_ptr<InputStream>> Create(const Executor& executor, int input,
                                                             std::vector<ConstBytes> other_inputs,
                                                             std::vector<MutableBytes> outputs);
  size_t bytes() const { return bytes_; }
  // Bytes [offset, offset + in.size()) of the input; offsets must continue where the previous
  // piece ended (InvalidArgument otherwise, or past the end).
  absl::Status Consume(size_t offset, absl::Span<const uint8_t> in);
  // OK once every byte of the input was consumed; FailedPrecondition naming how many are missing.
  absl::Status Finish() const;

 private:
  InputStream() = default;
  const Executor* executor_ = nullptr;
  std::shared_ptr<void> bound_;
  int input_ = -1;  // the streamed input's buffer index
  size_t element_ = 0, bytes_ = 0, consumed_ = 0;
  std::vector<uint8_t> carry_;  // the bytes of an element split between pieces
};

}  // namespace plexus::restructure
