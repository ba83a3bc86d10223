// The mailbox path: small collectives over the connections' mailboxes (shm, inproc), when every
// peer connection has one: fragments polled in place, no completion queue, each headed by a
// header that says which call it belongs to (mailbox_path.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "call_env.hpp"
#include "connection_set.hpp"
#include "plexus/collectives/types.hpp"
#include "wire.hpp"

namespace plexus::collectives::internal {

// Allreduces up to this size go by mailbox when every peer has one: below it the mailbox's
// in-place polling beats a plan over the transport's rings (docs/collectives.md, "Algorithms",
// small calls by mailbox).
constexpr size_t kMailboxPathBytes = 8192;

class MailboxPath {
 public:
  explicit MailboxPath(const CallEnv& env) : env_(env) {}
  MailboxPath(const MailboxPath&) = delete;
  MailboxPath& operator=(const MailboxPath&) = delete;

  // Every peer connection has a mailbox and `bytes` fit the path.
  bool Fits(size_t bytes) const {
    return env_.conns->mailboxes_ready && bytes <= kMailboxPathBytes;
  }

  // What arrives in a MailExchange: from rank `from` (-1: nothing), placed at `dst` or, with
  // `reduce`, folded into it (dst = dst op incoming; incoming op dst with src_first).
  struct MailInbound {
    int from = -1;
    uint8_t* dst = nullptr;
    bool reduce = false;
    bool src_first = false;
  };
  // Sends `bytes` of `data` to rank `to` (-1: nothing) and receives as many as `in` says, as
  // fragments of one mailbox message each, interleaved so that two ranks exchanging more than an
  // inbox holds never wait on each other. Incoming fragments are reduced straight from the
  // peer's slot; fragment k only after this rank's fragment k left (data may be dst). A failure
  // goes through env.abort, whose error this returns.
  absl::Status MailExchange(int to, const uint8_t* data, const MailInbound& in, size_t bytes,
                            DataType dtype, ReduceOp op, const CallHeader& header);
  // Small allreduce (and barrier) by recursive doubling: same pairs and reduction order as the
  // plan-based recursive doubling, so the results are the same bits.
  absl::Status MailboxAllReduce(uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                                const CallHeader& header);
  // A peer that sent this call's first message by mailbox while this rank runs a plan: the
  // ranks disagree on the call. OK when no such message waits (or there are no mailboxes).
  absl::Status CheckMailboxes(const CallHeader& header) const;

 private:
  transport::Mailbox* mailbox(int rank) const { return env_.conns->mailboxes[rank]; }

  const CallEnv& env_;
};

}  // namespace plexus::collectives::internal
