#include "work.hpp"

#include <exception>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/base/status.hpp"

namespace plexus::torch::internal {

absl::Status PlexusWork::Execute() {
  for (const auto& part : parts) {
    PLEXUS_RETURN_IF_ERROR(part());
  }
  if (post) {
    try {
      post();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("copying the result out: ", e.what()));
    }
  }
  return absl::OkStatus();
}

void PlexusWork::Finish(const absl::Status& status, int rank, int size) {
  parts.clear();
  post = nullptr;
  keep_alive.clear();
  std::exception_ptr error;
  if (!status.ok()) {
    error = std::make_exception_ptr(std::runtime_error(absl::StrCat(
        "plexus: ", what_, " failed on rank ", rank, " of ", size, ": ", status.ToString())));
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

bool PlexusWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout && scheduler != nullptr) {
    std::shared_ptr<Scheduler> s = scheduler;
    std::unique_lock<std::mutex> lock(s->mu);
    while (!isCompleted()) {
      if (!s->executing && !s->queue.empty() && s->queue.front()->sequence <= sequence) {
        s->RunHead(lock);
      } else {
        s->cv.wait(lock);
      }
    }
  }
  return c10d::Work::wait(timeout);
}

void Scheduler::RunHead(std::unique_lock<std::mutex>& lock) {
  c10::intrusive_ptr<PlexusWork> work = std::move(queue.front());
  queue.pop_front();
  executing = true;
  lock.unlock();
  const absl::Status status = work->Execute();
  lock.lock();
  executing = false;
  lock.unlock();
  cv.notify_all();  // the next call may start while this one's callbacks run
  work->Finish(status, rank, size);
  work->scheduler.reset();
  lock.lock();
  cv.notify_all();  // isCompleted() changed: waiters re-check under `mu`
}

}  // namespace plexus::torch::internal
