// plexus::transport::Store over the c10d::Store that torch hands a backend, so that the
// backend's rendezvous uses torch's store (and its per-group prefix) rather than a second one.
#pragma once

#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "plexus/transport/store.hpp"

namespace plexus::torch {

// c10d errors (thrown) become statuses naming the key and the operation: DeadlineExceeded when
// torch reports a timeout, Unavailable otherwise.
std::shared_ptr<transport::Store> AdaptStore(c10::intrusive_ptr<c10d::Store> store);

}  // namespace plexus::torch
