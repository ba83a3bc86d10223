// Small collectives over the connections' mailboxes (shm, inproc): fragments polled in place,
// no completion queue, each headed by a MailHeader that says which call it belongs to.
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "blame.hpp"
#include "mailbox_path.hpp"
#include "plan.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/kernels/reduce.hpp"
#include "qos_gate.hpp"
#include "tracer.hpp"

namespace plexus::collectives::internal {
namespace {

using transport::Completion;
using transport::ConstBuffer;

// The header of a mailbox message: enough to check that both ranks are in the same call (the
// fields CallHeader::SameCall compares, but the communicator id: mailboxes are per connection)
// under the same live-reconfiguration epoch (its low 16 bits: CallHeader::epoch).
struct MailHeader {
  static constexpr uint8_t kMagic = 0xC5;
  uint8_t magic = kMagic;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t algorithm = 0;
  uint8_t device_peer = 0;  // CallHeader::device_peer
  uint16_t epoch = 0;       // CallHeader::epoch mod 2^16
  uint32_t count = 0;
  int32_t root = -1;
  uint64_t sequence = 0;

  static MailHeader Of(const CallHeader& h) {
    MailHeader m;
    m.kind = static_cast<uint8_t>(h.kind);
    m.dtype = static_cast<uint8_t>(h.dtype);
    m.op = static_cast<uint8_t>(h.op);
    m.algorithm = static_cast<uint8_t>(h.algorithm);
    m.count = static_cast<uint32_t>(h.count);
    m.root = h.root;
    m.sequence = h.sequence;
    m.epoch = static_cast<uint16_t>(h.epoch);
    m.device_peer = h.device_peer ? 1 : 0;
    return m;
  }
  bool operator==(const MailHeader&) const = default;
  bool Valid() const {
    return magic == kMagic && kind < kNumCollectiveKinds && dtype < kNumDataTypes &&
           op < kNumReduceOps && algorithm < kNumAlgorithms;
  }
  // "allreduce #3 (count 2, f32, sum, halving_doubling)" for the peer's side of a mismatch.
  std::string Describe() const {
    if (!Valid()) return "a message that is not a Plexus collective";
    return absl::StrCat(std::string(CollectiveName(static_cast<CollectiveKind>(kind))), " #",
                        sequence, " (count ", count, ", ",
                        std::string(DataTypeName(static_cast<DataType>(dtype))), ", ",
                        std::string(ReduceOpName(static_cast<ReduceOp>(op))), ", ",
                        std::string(AlgorithmName(static_cast<Algorithm>(algorithm))),
                        root >= 0 ? absl::StrCat(", root ", root) : std::string(),
                        device_peer != 0 ? ", device buffers by peer access" : "", ")");
  }
};
static_assert(sizeof(MailHeader) == 24);
constexpr size_t kMailHeaderBytes = sizeof(MailHeader);
constexpr size_t kMailFragmentBytes = transport::Mailbox::kMaxMessageBytes - kMailHeaderBytes;
// Fragments hold whole elements of every type: each is reduced on its own, in place.
static_assert(kMailFragmentBytes % 8 == 0);

}  // namespace

absl::Status MailboxPath::MailExchange(int to, const uint8_t* data, const MailInbound& in,
                                       size_t bytes, DataType dtype, ReduceOp op,
                                       const CallHeader& header) {
  const auto& Abort = env_.abort;
  if (to >= 0 && env_.qos != nullptr) {  // QoS time windows: one admission per exchange
    if (absl::Status s = env_.AdmitSend(header); !s.ok()) return Abort(header, Failure::Own(s));
    env_.qos->Posted();
  }
  if (env_.trace != nullptr) env_.trace->NoteMailbox();
  const MailHeader mine = MailHeader::Of(header);
  const size_t esize = DataTypeSize(dtype);
  // A zero-byte vector still travels as one (empty) fragment: it carries the header.
  const size_t fragments =
      std::max<size_t>(1, (bytes + kMailFragmentBytes - 1) / kMailFragmentBytes);
  auto fragment_length = [&](size_t k) {
    const size_t offset = k * kMailFragmentBytes;
    return std::min(kMailFragmentBytes, bytes - std::min(bytes, offset));
  };
  size_t sent = to < 0 ? fragments : 0;
  size_t received = in.from < 0 ? fragments : 0;
  const base::WaitPolicy& wait = env_.wait;
  absl::Time start = absl::InfinitePast();
  absl::Duration idle = absl::ZeroDuration();
  absl::Duration next_wait_record = env_.record_after;  // idle time of the next wait record
  auto failed = [&](int peer, const absl::Status& why) {
    return Abort(header, Failure::Peer(peer, why));
  };
  uint32_t polls = 0;
  bool contended = false;  // a yield found the CPU contended: sleep until the next progress
  while (sent < fragments || received < fragments) {
    bool progress = false;
    if (sent < fragments) {
      const size_t length = fragment_length(sent);
      const ConstBuffer parts[2] = {{&mine, kMailHeaderBytes},
                                    {data + sent * kMailFragmentBytes, length}};
      absl::StatusOr<bool> ok = mailbox(to)->TrySend(absl::MakeConstSpan(parts, 2));
      if (!ok.ok()) return failed(to, ok.status());
      if (*ok) {
        ++sent;
        progress = true;
      }
    }
    if (received < fragments && (to < 0 || sent > received)) {
      transport::Mailbox* inbox = mailbox(in.from);
      absl::StatusOr<std::optional<absl::Span<const uint8_t>>> got = inbox->Peek();
      if (!got.ok()) return failed(in.from, got.status());
      if (got->has_value()) {
        const absl::Span<const uint8_t> message = **got;
        const size_t length = fragment_length(received);
        MailHeader theirs;
        if (message.size() >= kMailHeaderBytes) {
          std::memcpy(&theirs, message.data(), kMailHeaderBytes);
        }
        if (message.size() >= kMailHeaderBytes && theirs.Valid() && theirs.epoch != mine.epoch) {
          return Abort(header, Failure::Own(EpochMismatch(
                                   env_.rank, header.Describe(), header.epoch, in.from,
                                   theirs.Describe(), absl::StrCat(theirs.epoch, " (mod 2^16)"))));
        }
        if (message.size() < kMailHeaderBytes || !(theirs == mine) ||
            message.size() != kMailHeaderBytes + length) {
          return Abort(header, Failure::Own(MismatchedCalls(env_.rank, header.Describe(), in.from,
                                                            message.size() < kMailHeaderBytes
                                                                ? std::string("a truncated message")
                                                                : theirs.Describe())));
        }
        uint8_t* dst = in.dst + received * kMailFragmentBytes;
        const uint8_t* payload = message.data() + kMailHeaderBytes;
        if (in.reduce) {
          plexus::kernels::ReduceInto(dtype, op, dst, payload, length / esize, in.src_first);
        } else if (length > 0) {
          std::memcpy(dst, payload, length);
        }
        inbox->Release();
        ++received;
        progress = true;
      }
    }
    if (progress) {
      start = absl::InfinitePast();
      idle = absl::ZeroDuration();
      polls = 0;
      contended = false;
      next_wait_record = env_.record_after;
      if (env_.board->posted()) env_.board->Retract();
      continue;
    }
    // Past the yield window (or on a contended CPU) every pass sleeps anyway: read the clock on
    // each. A fragment can arrive (we sent ahead of what we received): sleep on the slot itself
    // (bounded, so that a dead peer is still noticed, and briefly while sends wait). Only
    // sending (the peer's inbox is full; it drains as the peer catches up, with no wake-up to
    // wait for): sleep briefly past the yield window, yield before it even if contended.
    const bool receivable = received < fragments && (to < 0 || sent > received);
    const bool long_wait = wait.At(idle) == base::WaitPolicy::Phase::kSleep;
    const bool sleeping =
        long_wait || (contended && receivable && idle >= base::WaitPolicy::kContendedPoll);
    if (++polls % 64 == 0 || sleeping || contended) {
      const absl::Time now = absl::Now();
      if (start == absl::InfinitePast()) start = now;
      idle = now - start;
      const int waited_for = sent < fragments ? to : in.from;
      if (idle > env_.timeout) return Abort(header, Failure::Stall({waited_for}));
      // Long without progress: publish whom this rank waits for (see Execute).
      if (idle >= next_wait_record) {
        env_.board->PostWaiting({waited_for}, absl::StatusCode::kDeadlineExceeded,
                                absl::StrCat("waiting for ", absl::FormatDuration(idle)), header);
        next_wait_record = idle + env_.record_every;
      }
      Completion sink[4];
      env_.conns->cq->Poll(absl::MakeSpan(sink));  // caller-mode progress notices a dead peer
      if (sleeping) {
        if (receivable) {
          const absl::Duration bound =
              sent == fragments ? absl::Milliseconds(10) : absl::Microseconds(200);
          mailbox(in.from)->Wait(std::min(env_.timeout - idle, bound));
        } else {
          base::WaitPolicy::Sleep(absl::Microseconds(200));
        }
        continue;
      }
    }
    if (wait.At(idle) != base::WaitPolicy::Phase::kSpin && !(contended && receivable)) {
      // Oversubscribed hosts yield to their peer ranks (see Execute).
      contended = base::WaitPolicy::Yield(/*can_sleep=*/receivable && !env_.yield_when_idle) &&
                  !env_.yield_when_idle;
    }
  }
  return absl::OkStatus();
}

absl::Status MailboxPath::MailboxAllReduce(uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                                           const CallHeader& header) {
  const Layout& L = *env_.layout;
  const size_t bytes = count * DataTypeSize(dtype);
  auto exchange = [&](int to, MailInbound in) {
    return MailExchange(to, buf, in, bytes, dtype, op, header);
  };
  // The plan path's recursive doubling schedule, run by run: at most one send and one receive
  // at this position per run, with the plan path's reduction order: the same bits.
  PLEXUS_ASSIGN_OR_RETURN(const RunnableSchedule* s, ScheduleOf(Shape::kRecursiveDoubling, L.n));
  const int me = L.pos();
  const std::vector<int>& mine = s->at[me];
  for (size_t begin = 0; begin < mine.size();) {
    int to = -1;
    MailInbound in;
    size_t end = begin;
    for (; end < mine.size() && s->run[mine[end]] == s->run[mine[begin]]; ++end) {
      const netmodel::Transfer& t = s->schedule.transfers[mine[end]];
      if (t.src == me) to = L.at(t.dst);
      if (t.dst == me) in = {L.at(t.src), buf, t.combine, t.src < t.dst};
    }
    PLEXUS_RETURN_IF_ERROR(exchange(to, in));
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status MailboxPath::CheckMailboxes(const CallHeader& header) const {
  if (!env_.conns->mailboxes_ready) return absl::OkStatus();
  for (int peer = 0; peer < env_.n; ++peer) {
    if (mailbox(peer) == nullptr) continue;
    auto got = mailbox(peer)->Peek();
    if (!got.ok() || !got->has_value() || (*got)->size() < kMailHeaderBytes) continue;
    MailHeader theirs;
    std::memcpy(&theirs, (*got)->data(), kMailHeaderBytes);
    // A message of a later call is the peer running ahead; one of this call means it chose the
    // mailbox path where this rank did not (different arguments); one of an earlier call was
    // never received here (a broadcast root that differed, say).
    if (!theirs.Valid() || theirs.sequence > header.sequence) continue;
    return MismatchedCalls(
        env_.rank, header.Describe(), peer, theirs.Describe(),
        theirs.sequence < header.sequence ? ", which this rank never received" : "");
  }
  return absl::OkStatus();
}

}  // namespace plexus::collectives::internal
