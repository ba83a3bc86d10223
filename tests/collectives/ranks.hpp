// Ranks as threads of the test process: one communicator per thread over a shared TCP store.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plexus/collectives/communicator.hpp"
#include "plexus/transport/store.hpp"
#include "support/loopback.hpp"

namespace plexus::collectives::testing {

// Runs body(rank, comm) on n threads that meet over `shared`, each with its own communicator made
// with options_of(rank); returns one message per rank ("" = success). Asserts nothing, so that
// it may itself run off the main thread (Catch2 assertions are not thread-safe).
inline std::vector<std::string> RunRanksOver(
    const std::shared_ptr<plexus::transport::Store>& shared, int n,
    const std::function<CommunicatorOptions(int)>& options_of,
    const std::function<std::string(int, Communicator&)>& body) {
  namespace pt = plexus::transport;
  std::vector<std::string> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto rdv = pt::Rendezvous::Create(r, n, shared);
      if (!rdv.ok()) {
        results[r] = "rendezvous: " + std::string(rdv.status().message());
        return;
      }
      auto comm = Communicator::Create(*rdv, options_of(r));
      if (!comm.ok()) {
        results[r] = "create: " + std::string(comm.status().message());
        return;
      }
      results[r] = body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// RunRanksOver a loopback store started here; requires that it starts, so main thread only.
inline std::vector<std::string> RunRanksWith(
    int n, const std::function<CommunicatorOptions(int)>& options_of,
    const std::function<std::string(int, Communicator&)>& body) {
  const plexus::testing::LoopbackStore loopback = plexus::testing::StartLoopbackStore();
  return RunRanksOver(loopback.store, n, options_of, body);
}

// RunRanksWith, the same options on every rank.
inline std::vector<std::string> RunRanks(
    int n, CommunicatorOptions options,
    const std::function<std::string(int, Communicator&)>& body) {
  return RunRanksWith(
      n, [&](int) { return options; }, body);
}

}  // namespace plexus::collectives::testing
