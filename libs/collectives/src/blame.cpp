#include "blame.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace plexus::collectives::internal {
namespace {

// How often a stalled rank re-reads its peers' accounts while it resolves whom to blame.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
// Time allowed for the final write beyond the resolution's deadline.
constexpr absl::Duration kWriteMargin = absl::Milliseconds(100);

std::optional<Blame> Read(transport::Store& store, uint64_t uid, int rank) {
  auto text = store.Get(BlameKey(uid, rank), absl::ZeroDuration());
  if (!text.ok()) return std::nullopt;
  return Blame::Decode(*text);
}

bool Names(const Blame& b, int rank) {
  return std::find(b.ranks.begin(), b.ranks.end(), rank) != b.ranks.end();
}

Blame Finalized(Blame b) {
  b.final = true;
  return b;
}

// Runs `fn` on a thread of its own and waits for its result until `deadline`: a store call
// blocked on a hung server must not hold this rank. The thread owns everything it touches.
template <typename T>
std::optional<T> RunBefore(absl::Time deadline, std::function<T()> fn) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<T> result;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, fn = std::move(fn)] {
    T value = fn();
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->result = std::move(value);
    }
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait_until(lock, absl::ToChronoTime(deadline),
                        [&] { return shared->result.has_value(); });
  return shared->result;
}

Blame Resolve(transport::Store& store, uint64_t uid, int self, const Blame& local,
              const std::vector<int>& consult, absl::Time deadline) {
  if (local.final) {
    // Accounts of ranks that closed on purpose were published before they closed.
    for (;;) {
      for (int r : consult) {
        std::optional<Blame> theirs = Read(store, uid, r);
        if (theirs && theirs->final && !Names(*theirs, self)) return *theirs;
      }
      if (consult.empty() || absl::Now() >= deadline) return local;
      absl::SleepFor(kPollInterval);
    }
  }
  (void)store.Set(BlameKey(uid, self), local.Encode());
  for (;;) {
    // Follow the ranks waited for through their own stall accounts; a rank that published
    // nothing is silent (a rank blocked on another one times out too, and says on which).
    std::vector<int> queue = local.ranks;
    std::vector<int> silent, named_by_others;
    for (size_t i = 0; i < queue.size(); ++i) {
      const int r = queue[i];
      std::optional<Blame> theirs = Read(store, uid, r);
      if (!theirs) {
        silent.push_back(r);
        continue;
      }
      if (theirs->final) {
        if (Names(*theirs, self)) continue;  // it gave up on this rank: it is alive
        return *theirs;
      }
      for (int next : theirs->ranks) {
        if (next == self) continue;
        named_by_others.push_back(next);
        if (std::find(queue.begin(), queue.end(), next) == queue.end()) queue.push_back(next);
      }
    }
    // Everyone reached waits for someone else reached: a cycle (ranks in different calls).
    if (silent.empty()) return Finalized(local);
    if (absl::Now() >= deadline) {
      // Silent ranks that another rank waits for too are the likelier culprits than one only
      // this rank waits for (that one may merely be late to publish).
      std::vector<int> confirmed;
      for (int r : silent) {
        if (std::find(named_by_others.begin(), named_by_others.end(), r) != named_by_others.end()) {
          confirmed.push_back(r);
        }
      }
      Blame out = Finalized(local);
      out.ranks = confirmed.empty() ? silent : confirmed;
      out.reporter = self;
      return out;
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace

std::string Blame::Encode() const {
  return absl::StrCat(final ? "F" : "W", "|", static_cast<int>(code), "|",
                      absl::StrJoin(ranks, ","), "|", reporter, "|", reason);
}

std::optional<Blame> Blame::Decode(std::string_view text) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(text.data(), text.size()), absl::MaxSplits('|', 4));
  if (f.size() != 5 || (f[0] != "F" && f[0] != "W")) return std::nullopt;
  Blame b;
  b.final = f[0] == "F";
  int code = 0;
  if (!absl::SimpleAtoi(f[1], &code) || code <= 0 || code > 16) return std::nullopt;
  b.code = static_cast<absl::StatusCode>(code);
  for (absl::string_view r : absl::StrSplit(f[2], ',', absl::SkipEmpty())) {
    int rank = -1;
    if (!absl::SimpleAtoi(r, &rank) || rank < 0) return std::nullopt;
    b.ranks.push_back(rank);
  }
  if (!absl::SimpleAtoi(f[3], &b.reporter)) return std::nullopt;
  b.reason = std::string(f[4]);
  return b;
}

std::string BlameKey(uint64_t uid, int rank) {
  return absl::StrCat("plexus/coll/blame/", absl::Hex(uid), "/", rank);
}

Blame ResolveBlame(std::shared_ptr<transport::Store> store, uint64_t uid, int self, Blame local,
                   std::vector<int> consult, absl::Time deadline) {
  if (store == nullptr) return Finalized(std::move(local));
  std::optional<Blame> resolved =
      RunBefore<Blame>(deadline + kWriteMargin, [store, uid, self, local, consult, deadline] {
        Blame b = Resolve(*store, uid, self, local, consult, deadline);
        (void)store->Set(BlameKey(uid, self), b.Encode());
        return b;
      });
  return resolved ? *std::move(resolved) : Finalized(std::move(local));
}

void AnnounceWaiting(std::shared_ptr<transport::Store> store, uint64_t uid, int self,
                     std::vector<int> ranks, absl::Time deadline) {
  if (store == nullptr) return;
  Blame b;
  b.final = false;
  b.code = absl::StatusCode::kUnavailable;
  b.ranks = std::move(ranks);
  b.reporter = self;
  (void)RunBefore<bool>(deadline, [store, uid, self, text = b.Encode()] {
    return store->Set(BlameKey(uid, self), text).ok();
  });
}

}  // namespace plexus::collectives::internal
