#include "blame.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "plexus/base/record.hpp"

namespace plexus::collectives::internal {
namespace {

// How often a stalled rank re-reads its peers' records while it resolves whom to blame.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
// Time allowed for the final write beyond the resolution's deadline.
constexpr absl::Duration kWriteMargin = absl::Milliseconds(100);
// A record's reason is cut to this many bytes: one key per rank stays small.
constexpr size_t kMaxReasonBytes = 1024;
// A record on the store: a base::Record of this kind and version.
constexpr std::string_view kBlameRecord = "collectives.blame";
constexpr uint16_t kBlameVersion = 2;
constexpr size_t kMaxBlamedRanks = size_t{1} << 20;

// A peer's record; nullopt when absent, malformed, or a wait record its writer stopped
// refreshing (stopped while waiting: it is not waiting any more, it is silent).
std::optional<Blame> Read(transport::Store& store, uint64_t uid, int rank,
                          absl::Duration stale_after) {
  auto text = store.Get(BlameKey(uid, rank), absl::ZeroDuration());
  if (!text.ok()) return std::nullopt;
  std::optional<Blame> b = Blame::Decode(*text);
  if (b && !b->final &&
      absl::ToUnixMillis(absl::Now()) - b->at_ms > absl::ToInt64Milliseconds(stale_after)) {
    return std::nullopt;
  }
  return b;
}

bool Names(const Blame& b, int rank) {
  return std::find(b.ranks.begin(), b.ranks.end(), rank) != b.ranks.end();
}

std::string EncodedCall(const CallHeader& h) {
  std::string out(CallHeader::kEncodedSize, '\0');
  h.Encode(reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// Two ranks waiting in calls that cannot meet: the same collective call number of one
// communicator, but another collective or other arguments (or epoch). A rank one call ahead of
// another is no mismatch (it finished its part early and waits for a late one), and Send/Recv
// number their messages per pair: neither is compared.
bool DifferentCalls(const CallHeader& a, const CallHeader& b) {
  if (a.kind == CollectiveKind::kSendRecv || b.kind == CollectiveKind::kSendRecv) return false;
  if (a.sequence != b.sequence || a.communicator != b.communicator) return false;
  return !a.SameCall(b) || a.epoch != b.epoch;
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

Blame ResolveFrom(transport::Store& store, uint64_t uid, int self, const Blame& local,
                  const std::vector<int>& consult, absl::Time deadline,
                  absl::Duration stale_after) {
  if (local.final) {
    // Accounts of ranks that closed on purpose were published before they closed.
    for (;;) {
      for (int r : consult) {
        std::optional<Blame> theirs = Read(store, uid, r, stale_after);
        if (theirs && theirs->final && !Names(*theirs, self)) return *theirs;
      }
      if (consult.empty() || absl::Now() >= deadline) return local;
      absl::SleepFor(kPollInterval);
    }
  }
  for (;;) {
    // Follow the ranks waited for through their wait records (posted after half the timeout
    // without progress, so mostly there already); a rank reached without one is silent.
    std::vector<int> queue = local.ranks;
    std::vector<int> silent, named_by_others;
    for (size_t i = 0; i < queue.size(); ++i) {
      const int r = queue[i];
      std::optional<Blame> theirs = Read(store, uid, r, stale_after);
      if (!theirs) {
        silent.push_back(r);
        continue;
      }
      if (theirs->final) {
        if (Names(*theirs, self)) continue;  // it gave up on this rank: it is alive
        return *theirs;
      }
      // Waiting in another call: neither can progress, whatever the transport holds unmatched.
      if (local.call && theirs->call && DifferentCalls(*local.call, *theirs->call)) {
        Blame out = Finalized(local);
        out.code = absl::StatusCode::kFailedPrecondition;
        out.ranks.clear();
        out.reporter = self;
        out.reason = absl::StrCat(
            "rank ", self, " is in ", local.call->Describe(), " (epoch ", local.call->epoch,
            ") while rank ", r, " is in ", theirs->call->Describe(), " (epoch ",
            theirs->call->epoch,
            "): the ranks made different calls; every rank of a communicator must make the same "
            "collective calls, with the same arguments, in the same order");
        return out;
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
      // this rank waits for (that one may merely be late to post).
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
  return base::RecordWriter(kBlameRecord, kBlameVersion)
      .Int("final", final ? 1 : 0)
      .Int("code", static_cast<int>(code))
      .Ints("ranks", ranks)
      .Int("reporter", reporter)
      .Int("at_ms", at_ms)
      .String("reason", std::string_view(reason).substr(0, kMaxReasonBytes))
      .String("call", call ? absl::BytesToHexString(EncodedCall(*call)) : std::string())
      .Finish();
}

std::optional<Blame> Blame::Decode(std::string_view text) {
  absl::StatusOr<base::RecordReader> r =
      base::RecordReader::Parse(text, kBlameRecord, kBlameVersion);
  if (!r.ok()) return std::nullopt;
  Blame b;
  b.final = r->Int("final", 0, 1) == 1;
  // The non-OK codes (CANCELLED .. UNAUTHENTICATED).
  b.code = static_cast<absl::StatusCode>(r->IntAs<int>("code", 1, 16));
  b.ranks = r->Ints<int>("ranks", kMaxBlamedRanks, 0);
  b.reporter = r->IntAs<int>("reporter");
  b.at_ms = r->Int("at_ms");
  b.reason = r->String("reason", kMaxReasonBytes);
  const std::string call = r->String("call", 2 * CallHeader::kEncodedSize);
  if (!r->Finish().ok()) return std::nullopt;
  if (!call.empty()) {
    if (call.size() != 2 * CallHeader::kEncodedSize ||
        !std::all_of(call.begin(), call.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
      return std::nullopt;
    }
    const std::string bytes = absl::HexStringToBytes(call);
    absl::StatusOr<CallHeader> h = CallHeader::Decode(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    if (!h.ok()) return std::nullopt;
    b.call = *h;
  }
  return b;
}

std::string BlameKey(uint64_t uid, int rank) {
  return absl::StrCat("plexus/coll/blame/", absl::Hex(uid), "/", rank);
}

// The writer thread's state; the thread holds it (and the store) after the board is gone.
struct BlameBoard::Shared {
  std::mutex mu;
  std::condition_variable cv;
  bool has_pending = false;
  std::optional<std::string> pending;  // nullopt: delete
  std::string failure;                 // non-empty: report the job failed after the write
  bool failure_reported = false;
  uint64_t requested = 0, written = 0;
  bool started = false, stop = false;
};

BlameBoard::BlameBoard(std::shared_ptr<transport::Store> store, uint64_t uid, int self,
                       absl::Duration stale_after)
    : store_(std::move(store)),
      uid_(uid),
      self_(self),
      stale_after_(stale_after),
      shared_(std::make_shared<Shared>()) {}

BlameBoard::~BlameBoard() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;  // the thread still writes what is pending, then ends
  }
  shared_->cv.notify_all();
}

void BlameBoard::Request(std::optional<std::string> value) {
  if (store_ == nullptr) return;
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->pending = std::move(value);
  shared_->has_pending = true;
  ++shared_->requested;
  if (!shared_->started) {
    shared_->started = true;
    std::thread([shared = shared_, store = store_, key = BlameKey(uid_, self_), self = self_] {
      std::unique_lock<std::mutex> lock(shared->mu);
      for (;;) {
        shared->cv.wait(lock, [&] { return shared->has_pending || shared->stop; });
        if (!shared->has_pending) return;
        std::optional<std::string> value = std::move(shared->pending);
        const std::string failure = std::exchange(shared->failure, std::string());
        const uint64_t generation = shared->requested;
        shared->has_pending = false;
        lock.unlock();
        if (value) {
          (void)store->Set(key, *value);
        } else {
          (void)store->Delete(key);
        }
        // After the account, so that whoever acts on the report finds the account there.
        if (!failure.empty()) (void)transport::ReportJobFailure(*store, self, failure);
        lock.lock();
        shared->written = generation;
        shared->cv.notify_all();
      }
    }).detach();
  }
  shared_->cv.notify_all();
}

void BlameBoard::Post(Blame b) {
  b.at_ms = absl::ToUnixMillis(absl::Now());
  posted_ = true;
  if (b.final && store_ != nullptr) {
    // A final account: the job failed. Reported once, for the store's server (rank 0), whose
    // exit then does not wait for ranks that will never leave the store.
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->failure_reported) {
      shared_->failure_reported = true;
      shared_->failure = b.reason.empty() ? std::string("communicator failed") : b.reason;
    }
  }
  Request(b.Encode());
}

void BlameBoard::PostWaiting(std::vector<int> ranks, absl::StatusCode code, std::string reason,
                             std::optional<CallHeader> call) {
  Blame b;
  b.final = false;
  b.call = std::move(call);
  b.code = code;
  b.ranks = std::move(ranks);
  b.reporter = self_;
  b.reason = std::move(reason);
  Post(std::move(b));
}

void BlameBoard::Retract() {
  if (!posted_) return;
  posted_ = false;
  Request(std::nullopt);
}

bool BlameBoard::Flush(absl::Time deadline) {
  if (store_ == nullptr) return true;
  std::unique_lock<std::mutex> lock(shared_->mu);
  return shared_->cv.wait_until(lock, absl::ToChronoTime(deadline),
                                [&] { return shared_->written >= shared_->requested; });
}

Blame BlameBoard::Resolve(Blame local, std::vector<int> consult, absl::Time deadline) {
  if (store_ == nullptr) return Finalized(std::move(local));
  if (!local.final) Post(local);
  // The reads end at `deadline`; half the margin lets their answer come back.
  std::optional<Blame> resolved = RunBefore<Blame>(
      deadline + kWriteMargin / 2, [store = store_, uid = uid_, self = self_, local,
                                    consult = std::move(consult), deadline, stale = stale_after_] {
        return ResolveFrom(*store, uid, self, local, consult, deadline, stale);
      });
  Blame out = resolved ? *std::move(resolved) : Finalized(std::move(local));
  Post(out);
  Flush(deadline + kWriteMargin);
  return out;
}

}  // namespace plexus::collectives::internal
