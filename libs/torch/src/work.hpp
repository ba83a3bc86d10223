// The Works the torch backend's calls return and the queue that runs them (see Scheduler).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/status/status.h"

namespace plexus::torch::internal {

// One blocking communicator call of a Work (run by whichever thread executes the Work).
using Call = std::function<absl::Status()>;

class PlexusWork;

// The group's queue of issued calls, shared with its Works (a Work may outlive the group). The
// calls run one at a time in issue order, in the group's executor thread or in a thread blocked
// in Work::wait() on one of them (it runs the queue up to its own call itself, so that a
// synchronous call costs no thread hand-off). Each call is a blocking communicator call made in
// the running thread: no thread of the communicator is involved. Results are completed (the
// future's callbacks run) after the executing role is released, so a callback may wait() on a
// later call.
struct Scheduler {
  int rank = 0;
  int size = 1;
  std::mutex mu;
  std::condition_variable cv;  // queue, executing and completions changed
  std::deque<c10::intrusive_ptr<PlexusWork>> queue;
  uint64_t issued = 0;     // sequence number of the last queued Work
  bool executing = false;  // a thread runs a call of the queue's head
  bool stop = false;

  // Runs the head of the queue (its calls, copies out, completion). Called with `lock` held,
  // !executing and a non-empty queue; returns with it held.
  void RunHead(std::unique_lock<std::mutex>& lock);
};

// The Work a call returns: completed once its communicator calls ran (in issue order, see
// Scheduler) and the post step (copies into the caller's tensors) ran.
class PlexusWork final : public c10d::Work {
 public:
  PlexusWork(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        what_(std::move(what)),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  // The sender of a completed recv from any source.
  int sourceRank() const override {
    const int source = source_rank.load();
    TORCH_CHECK(source >= 0, "plexus: sourceRank() of ", what_,
                ": only a completed recv from any source has one");
    return source;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Filled by the issuing call before the work is queued; read by the executing thread.
  std::vector<Call> parts;             // blocking communicator calls, in order
  std::function<void()> post;          // runs after every part succeeded
  std::vector<at::Tensor> keep_alive;  // staging buffers the parts read or write
  uint64_t sequence = 0;               // position in the group's issue order
  std::atomic<int> source_rank{-1};    // set by a recv from any source
  std::shared_ptr<Scheduler> scheduler;

  // Runs the parts (stopping at the first failure: the communicator is broken then) and the
  // post step; returns the work's status.
  absl::Status Execute();

  // Completes the future (running its callbacks) and the work; drops the buffers.
  void Finish(const absl::Status& status, int rank, int size);

  // A blocking wait runs the queue up to this work in the calling thread when no other thread
  // executes it already (the GIL is released by torch's binding).
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  std::string what_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace plexus::torch::internal
