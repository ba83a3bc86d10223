// A pair of multipath channels across a netbed: side a connects path k from 10.77.k.1 to
// 10.77.k.2 (so path k's veth carries it), side b accepts. For tests and benchmarks.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "netbed.hpp"
#include "plexus/base/status.hpp"
#include "plexus/multipath/channel.hpp"
#include "plexus/transport/device.hpp"

namespace plexus::netbed {

struct BedChannels {
  Bed* bed = nullptr;
  std::shared_ptr<transport::Device> dev_a, dev_b;
  transport::CompletionQueue cq_a, cq_b;
  std::unique_ptr<multipath::MultipathChannel> a, b;
  std::unique_ptr<transport::Listener> listener;
  std::string port;

  static absl::StatusOr<std::unique_ptr<BedChannels>> Create(
      Bed& bed, const multipath::ChannelOptions& options) {
    auto out = std::make_unique<BedChannels>();
    out->bed = &bed;
    transport::DeviceOptions d;
    d.backend = transport::Backend::kTcp;
    d.connect_timeout = absl::Seconds(3);
    PLEXUS_ASSIGN_OR_RETURN(out->dev_a, transport::Device::Create(d));
    PLEXUS_ASSIGN_OR_RETURN(out->dev_b, transport::Device::Create(d));
    PLEXUS_ASSIGN_OR_RETURN(out->a, multipath::MultipathChannel::Create(options, &out->cq_a));
    PLEXUS_ASSIGN_OR_RETURN(out->b, multipath::MultipathChannel::Create(options, &out->cq_b));
    BedChannels* self = out.get();
    PLEXUS_RETURN_IF_ERROR(InNetns(bed.ns('b'), [self]() -> absl::Status {
      PLEXUS_ASSIGN_OR_RETURN(self->listener, self->dev_b->Listen("0.0.0.0:0"));
      return absl::OkStatus();
    }));
    const std::string address = out->listener->address();
    out->port = address.substr(address.rfind(':') + 1);
    return out;
  }

  // Connects path k (1-based) and adds it to both channels; returns its index on side a.
  absl::StatusOr<int> Connect(size_t k) {
    std::unique_ptr<transport::Connection> conn;
    PLEXUS_RETURN_IF_ERROR(InNetns(bed->ns('a'), [&]() -> absl::Status {
      PLEXUS_ASSIGN_OR_RETURN(
          conn, dev_a->ConnectFrom(Bed::Address('a', k),
                                   absl::StrCat(Bed::Address('b', k), ":", port), a->path_queue()));
      return absl::OkStatus();
    }));
    PLEXUS_ASSIGN_OR_RETURN(auto accepted, listener->Accept(b->path_queue(), absl::Seconds(5)));
    PLEXUS_ASSIGN_OR_RETURN(int index, a->AddPath(std::move(conn)));
    PLEXUS_RETURN_IF_ERROR(b->AddPath(std::move(accepted)).status());
    return index;
  }

  // Waits until both sides have `n` live paths.
  absl::Status WaitLive(int n, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (a->live_paths() != n || b->live_paths() != n) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("live paths: ", a->live_paths(), " and ",
                                                        b->live_paths(), ", expected ", n));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::OkStatus();
  }
};

}  // namespace plexus::netbed
