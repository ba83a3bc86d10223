// Where the dispatcher meets the communicator: a RankExchange (token counts and offsets, int64)
// turned into the element counts and displacements (size_t) that Communicator::AllToAllV takes,
// and the two all-to-alls of an MoE layer (tokens out to their experts, results back).
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/moe/dispatch.hpp"

namespace plexus::moe {

// Counts and displacements in elements (tokens x elements_per_token), one entry per rank, in the
// types of Communicator::AllToAllV.
struct ElementExchange {
  std::vector<size_t> send_counts, send_displs;
  std::vector<size_t> recv_counts, recv_displs;
  size_t send_elements = 0;  // size of the send buffer
  size_t recv_elements = 0;  // size of the receive buffer
};
ElementExchange ToElementExchange(const RankExchange& exchange, size_t elements_per_token);

// Dispatch: `send` holds exchange.send_counts tokens per destination (laid out as RankExchange
// says), `recv` receives exchange.recv_counts tokens per source. Collective over `comm`, whose
// ranks are the dispatch's ranks. Errors are the communicator's (they name the failed rank).
absl::Status DispatchTokens(collectives::Communicator& comm, const ElementExchange& exchange,
                            const float* send, float* recv);
// Combine: the reverse all-to-all; `results` is laid out like DispatchTokens' `recv`, `out` like
// its `send`.
absl::Status CombineTokens(collectives::Communicator& comm, const ElementExchange& exchange,
                           const float* results, float* out);

}  // namespace plexus::moe
