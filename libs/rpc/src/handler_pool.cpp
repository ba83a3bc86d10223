// Synchronous handlers off the dispatcher thread: HandlerPool (ServerOptions::handler_threads)
// and where a call's synchronous handler runs (ServerCallImpl::RunSync).
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server_impl.hpp"

namespace plexus::rpc::internal {

void ServerCallImpl::RunSync(ServiceBase* service, SyncHandler handler) {
  HandlerPool* pool = conn_->server->handlers.get();
  if (runs_inline_ || pool == nullptr) {
    Finish(handler(service, *this));
    return;
  }
  pool->Push(shared_from_this(), service, handler);
}

bool ServerCallImpl::FinishIfStale(const char* waiting) {
  if (IsCancelled()) {
    Finish(absl::CancelledError(absl::StrCat("the call was cancelled while ", waiting)));
    return true;
  }
  if (absl::Now() > deadline_) {
    Finish(absl::DeadlineExceededError(absl::StrCat("deadline exceeded while ", waiting,
                                                    " on the server (", info_.service->full_name,
                                                    "/", info_.method->name, ")")));
    return true;
  }
  return false;
}

void HandlerPool::Push(std::shared_ptr<ServerCallImpl> call, ServiceBase* service,
                       SyncHandler handler) {
  absl::Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      refused = absl::UnavailableError("the rpc server is shutting down");
    } else if (queue_.size() + running_ >= max_threads_ + max_waiting_) {
      const CallInfo& info = call->info();
      refused = absl::ResourceExhaustedError(absl::StrCat(
          info.service->full_name, "/", info.method->name, " refused: ", queue_.size(),
          " calls wait for the server's ", max_threads_,
          " handler threads, all busy (ServerOptions::handler_queue ", max_waiting_,
          ", handler_threads ", max_threads_,
          "); raise them, or register methods that never block to run on the dispatcher"));
    } else {
      queue_.push_back({std::move(call), service, handler});
      if (queue_.size() + running_ > threads_.size() && threads_.size() < max_threads_) {
        threads_.emplace_back([this] { Run(); });
      }
    }
  }
  if (!refused.ok()) {
    call->Finish(std::move(refused));
    return;
  }
  cv_.notify_one();
}

void HandlerPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // the calls still queued are Stop's to fail
    Job job = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    if (!job.call->FinishIfStale("waiting for a handler thread")) {
      job.call->Finish(job.handler(job.service, *job.call));
    }
    job = {};  // the call may recycle now, outside the lock
    lock.lock();
    --running_;
  }
}

void HandlerPool::Stop() {
  std::deque<Job> dropped;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    dropped.swap(queue_);
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (Job& j : dropped) j.call->Finish(absl::UnavailableError("the rpc server is shutting down"));
  dropped.clear();
  for (std::thread& t : threads) t.join();
}

}  // namespace plexus::rpc::internal
