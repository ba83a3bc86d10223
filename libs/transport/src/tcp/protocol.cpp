#include "tcp/protocol.hpp"

#include <algorithm>

namespace plexus::transport::internal::tcp {

StripeRange StripePart(uint64_t length, size_t sockets, size_t k) {
  const uint64_t part = sockets == 0 ? length : (length + sockets - 1) / sockets;
  // k * part cannot overflow: part <= length / sockets + 1 and k < sockets.
  const uint64_t begin = std::min<uint64_t>(length, k * part);
  const uint64_t end = std::min<uint64_t>(length, begin + part);
  return {begin, end - begin};
}

absl::StatusOr<HeaderPlan> PlanHeader(const FrameHeader& h, size_t socket, size_t sockets,
                                      uint64_t writes_awaiting_ack, uint64_t next_stripe) {
  const bool control = socket == 0;
  HeaderPlan plan;
  switch (h.type) {
    case FrameType::kClose:
      if (!control) return absl::DataLossError("close on a data socket");
      plan.action = HeaderAction::kClose;
      return plan;
    case FrameType::kWriteAck:
      if (!control) return absl::DataLossError("ack on a data socket");
      if (h.a > writes_awaiting_ack) return absl::DataLossError("ack for writes never sent");
      plan.action = HeaderAction::kAck;
      plan.acked = h.a;
      return plan;
    case FrameType::kMessage:
    case FrameType::kWrite:
    case FrameType::kStripeHead:
      if (!control) return absl::DataLossError("frame: operation head on a data socket");
      plan.action = HeaderAction::kOperation;
      plan.striped = h.type == FrameType::kStripeHead;
      plan.is_write = h.type == FrameType::kWrite || (plan.striped && (h.flags & kFlagWrite) != 0);
      if (plan.striped && sockets == 1) {
        return absl::DataLossError("striped frame on a single-socket connection");
      }
      plan.first_bytes = plan.striped ? StripePart(h.length, sockets, 0).length : h.length;
      return plan;
    case FrameType::kStripePart:
      if (control) return absl::DataLossError("stripe part on the control socket");
      if (h.a != next_stripe) return absl::DataLossError("stripe part out of order");
      plan.action = HeaderAction::kStripePart;
      return plan;
  }
  return absl::DataLossError("frame of unknown type");
}

bool PartMatches(const FrameHeader& part, size_t socket, size_t sockets, uint64_t op_length) {
  if (socket == 0 || socket >= sockets) return false;
  const StripeRange want = StripePart(op_length, sockets, socket);
  return part.b == want.offset && part.length == want.length;
}

}  // namespace plexus::transport::internal::tcp
