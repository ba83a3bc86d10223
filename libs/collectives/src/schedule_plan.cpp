// Lowering the network model's schedules to plans: the transfers at one position become its
// sends and receives, chunk by chunk, with dependencies derived from the data each moves.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plan.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives::internal {
namespace {

namespace nm = plexus::netmodel;

size_t NumChunks(const Layout& L, size_t count) {
  const size_t ce = L.chunk_elems();
  return (count + ce - 1) / ce;
}

absl::StatusOr<nm::Schedule> Build(Shape shape, int n) {
  switch (shape) {
    case Shape::kRing:
      return nm::RingAllreduceSchedule(n, 1);
    case Shape::kRingReduceScatter:
      return nm::RingAllreduceSchedule(n, 1, 1, nm::Phases::kReduceScatter);
    case Shape::kRingAllGather:
      return nm::RingAllreduceSchedule(n, 1, 1, nm::Phases::kAllGather);
    case Shape::kHalvingDoubling:
      return nm::HalvingDoublingSchedule(n, 1);
    case Shape::kHalving:
      return nm::HalvingDoublingSchedule(n, 1, nm::HalvingOrder::kFarFirst,
                                         nm::Phases::kReduceScatter);
    case Shape::kDoubling:
      return nm::HalvingDoublingSchedule(n, 1, nm::HalvingOrder::kFarFirst, nm::Phases::kAllGather);
    case Shape::kRecursiveDoubling:
      return nm::RecursiveDoublingSchedule(n, 1);
    case Shape::kDoubleBinaryTree:
      return nm::DoubleBinaryTreeSchedule(n, 1);
    case Shape::kBruck:
      return nm::BruckAllgatherSchedule(n, 1);
  }
  return absl::InvalidArgumentError(absl::StrCat("no schedule shape ", static_cast<int>(shape)));
}

}  // namespace

absl::StatusOr<RunnableSchedule> MakeRunnable(nm::Schedule schedule, int n) {
  RunnableSchedule r;
  const int pieces = schedule.pieces;
  auto bad = [&](size_t i, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule '", schedule.name, "' transfer ", i, ": ", why));
  };
  if (pieces < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule '", schedule.name, "' names no pieces: it only sizes transfers"));
  }
  r.at.resize(n);
  r.run.resize(schedule.transfers.size());
  int run = 0;
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const nm::Transfer& t = schedule.transfers[i];
    if (t.src < 0 || t.src >= n || t.dst < 0 || t.dst >= n) {
      return bad(i, absl::StrCat(t.src, " -> ", t.dst, " is outside positions 0..", n - 1));
    }
    if (t.first_piece < 0 || t.first_piece >= pieces || t.piece_count < 0 ||
        t.piece_count > pieces) {
      return bad(i, absl::StrCat("pieces ", t.first_piece, " + ", t.piece_count,
                                 " outside the schedule's ", pieces));
    }
    for (int d : t.after) {
      if (d < 0 || static_cast<size_t>(d) >= i) return bad(i, absl::StrCat("waits for ", d));
    }
    if (i > 0 && t.round != schedule.transfers[i - 1].round) ++run;
    r.run[i] = run;
    if (t.src == t.dst) continue;  // a local step: nothing moves
    r.at[t.src].push_back(static_cast<int>(i));
    r.at[t.dst].push_back(static_cast<int>(i));
  }
  r.schedule = std::move(schedule);
  return r;
}

void BuildFromSchedule(const RunnableSchedule& s, const Layout& L, uint8_t* buf,
                       std::span<const Block> pieces, int slices, const uint8_t* input,
                       Plan* plan) {
  const int me = L.pos();
  const int P = s.schedule.pieces;
  const size_t total = static_cast<size_t>(P) * slices;
  // Per piece (of all slices): the first receive of the transfer that last wrote it here, the
  // first send of the transfer that last read it from buf, and whether anything arrived yet.
  std::vector<int> writer(total, -1), reader(total, -1);
  std::vector<uint8_t> touched(total, 0);
  const std::vector<int>& mine = s.at[me];
  const auto& transfers = s.schedule.transfers;
  for (int slice = 0; slice < slices; ++slice) {
    auto each_piece = [&](const nm::Transfer& t, auto&& fn) {
      for (int x = 0; x < t.piece_count; ++x) {
        const size_t g = static_cast<size_t>(slice) * P + (t.first_piece + x) % P;
        fn(g, pieces[g]);
      }
    };
    // A transfer's messages take the channels in turn, from a channel that moves on with the
    // slice (a pipeline's consecutive slices) and, in a sliced schedule, with the piece (the two
    // trees of a slice): both ends compute the same channel for each message.
    auto first_channel = [&](const nm::Transfer& t) {
      return static_cast<size_t>(slice) + (slices > 1 ? static_cast<size_t>(t.first_piece) : 0);
    };
    for (size_t begin = 0; begin < mine.size();) {
      size_t end = begin;
      while (end < mine.size() && s.run[mine[end]] == s.run[mine[begin]]) ++end;
      // The run's sends, reading what this rank held before the round.
      for (size_t i = begin; i < end; ++i) {
        const nm::Transfer& t = transfers[mine[i]];
        if (t.src != me) continue;
        const int peer = L.at(t.dst);
        size_t channel = first_channel(t);
        each_piece(t, [&](size_t g, const Block& b) {
          const bool from_input = input != nullptr && !touched[g];
          const int first = static_cast<int>(plan->sends.size());
          for (size_t k = 0; k < NumChunks(L, b.count); ++k) {
            const size_t start = k * L.chunk_elems();
            const size_t offset = b.offset + start;
            SendOp op;
            op.data = (from_input ? input : buf) + offset * L.esize;
            op.bytes = std::min(L.chunk_elems(), b.count - start) * L.esize;
            op.peer = peer;
            op.channel = static_cast<int>(channel++ % L.channels);
            op.dep = writer[g] >= 0 ? writer[g] + static_cast<int>(k) : -1;
            op.final = !t.combine;
            plan->sends.push_back(op);
          }
          if (!from_input) reader[g] = first;
        });
      }
      // Its receives, each waiting for the sends of its chunk from buf to have completed.
      for (size_t i = begin; i < end; ++i) {
        const nm::Transfer& t = transfers[mine[i]];
        if (t.dst != me) continue;
        const int peer = L.at(t.src);
        size_t channel = first_channel(t);
        each_piece(t, [&](size_t g, const Block& b) {
          const int first = static_cast<int>(plan->recvs.size());
          for (size_t k = 0; k < NumChunks(L, b.count); ++k) {
            const size_t start = k * L.chunk_elems();
            const size_t offset = b.offset + start;
            RecvOp op;
            op.data = buf + offset * L.esize;
            op.bytes = std::min(L.chunk_elems(), b.count - start) * L.esize;
            op.peer = peer;
            op.channel = static_cast<int>(channel++ % L.channels);
            op.reduce = t.combine;
            op.src_first = t.src < t.dst;  // the lower position's operand first, always
            if (t.combine && input != nullptr && !touched[g]) {
              op.local = input + offset * L.esize;
            }
            op.war_prefix = reader[g] >= 0 ? reader[g] + static_cast<int>(k) + 1 : 0;
            plan->recvs.push_back(op);
          }
          writer[g] = first;
          touched[g] = 1;
        });
      }
      begin = end;
    }
  }
}

absl::StatusOr<const RunnableSchedule*> ScheduleOf(Shape shape, int n) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<Shape, int>, std::unique_ptr<RunnableSchedule>>;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*cache)[{shape, n}];
  if (slot == nullptr) {
    PLEXUS_ASSIGN_OR_RETURN(nm::Schedule schedule, Build(shape, n));
    PLEXUS_ASSIGN_OR_RETURN(RunnableSchedule runnable, MakeRunnable(std::move(schedule), n));
    slot = std::make_unique<RunnableSchedule>(std::move(runnable));
  }
  return slot.get();
}

}  // namespace plexus::collectives::internal
