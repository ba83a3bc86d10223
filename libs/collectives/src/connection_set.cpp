// The connection set (connection_set.hpp): built at creation, and rebuilt (keeping the
// connections that do not change) and swapped in by a live change of the transport or the
// channel count (CommunicatorImpl::ChangeConnections, docs/collectives.md, "Changing the
// transport or the channels").
#include "connection_set.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "communicator_impl.hpp"
#include "peer_transport.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/status.hpp"

namespace plexus::collectives::internal {

void ConnectionSet::Close() {
  for (auto& channel : conns) {
    for (auto& c : channel) {
      if (c) c->Close();
    }
  }
}

void ConnectionSet::Progress(absl::Duration max_block) {
  if (driver != nullptr) {
    driver->Progress(max_block);
  } else if (device != nullptr) {
    device->Progress(max_block);
  } else {
    absl::SleepFor(max_block);
  }
}

std::string ConnectionSet::DownRanks(int n) const {
  std::vector<std::string> down;
  for (int r = 0; r < n; ++r) {
    for (const auto& channel : conns) {
      if (!channel[r]) continue;
      const absl::Status s = channel[r]->status();
      if (!s.ok()) {
        // The transport reports a deliberate close as Aborted: that rank is alive and gave up
        // (usually after an error of its own); anything else means it died or is unreachable.
        down.push_back(absl::IsAborted(s) ? absl::StrCat("rank ", r, " (closed its connection)")
                                          : absl::StrCat("rank ", r));
        break;
      }
    }
  }
  return absl::StrJoin(down, ", ");
}

std::vector<const transport::Connection*> ConnectionSet::Connections() const {
  std::vector<const transport::Connection*> out;
  for (const auto& channel : conns) {
    for (const auto& conn : channel) {
      if (conn != nullptr) out.push_back(conn.get());
    }
  }
  return out;
}

std::vector<std::vector<transport::Backend>> PairBackends(TransportPolicy policy,
                                                          transport::Backend base,
                                                          const std::vector<std::string>& hosts) {
  const size_t n = hosts.size();
  std::vector<std::vector<transport::Backend>> out(n, std::vector<transport::Backend>(n, base));
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      if (a != b) out[a][b] = PairBackend(policy, base, hosts[a], hosts[b]);
    }
  }
  return out;
}

absl::Status OpenDevices(const ConnectionSpec& spec,
                         absl::Span<const std::shared_ptr<transport::Device>> reuse,
                         ConnectionSet* set) {
  if (spec.caller_device != nullptr) {
    set->devices.push_back(spec.caller_device);
  } else {
    // One device per backend this rank uses, shm first (see MultiDeviceDriver).
    for (transport::Backend backend : {transport::Backend::kInproc, transport::Backend::kShm,
                                       transport::Backend::kTcp, transport::Backend::kVerbs}) {
      bool used = false;
      for (int r = 0; r < spec.n; ++r) {
        used = used || (r != spec.rank && spec.peer_backend[r] == backend);
      }
      if (!used) continue;
      auto same = std::find_if(reuse.begin(), reuse.end(),
                               [&](const auto& d) { return d && d->backend() == backend; });
      if (same != reuse.end()) {
        set->devices.push_back(*same);
        continue;
      }
      transport::DeviceOptions o = spec.device_options;
      o.backend = backend;
      auto created = transport::Device::Create(o);
      if (!created.ok()) {
        return absl::Status(created.status().code(),
                            absl::StrCat("rank ", spec.rank, ": creating the ",
                                         std::string(transport::BackendName(backend)),
                                         " device: ", std::string(created.status().message())));
      }
      set->devices.push_back(*std::move(created));
    }
  }
  set->device = set->devices.empty() ? nullptr : set->devices.back().get();
  return absl::OkStatus();
}

void MakeQueue(const ConnectionSpec& spec, ConnectionSet* set) {
  if (spec.n == 1 || set->device == nullptr) return;
  // The caller's device decides its own queue; inproc completes inside the Post calls (its
  // queue has no driver). Neither changes devices while connections are kept.
  if (spec.caller_device != nullptr ||
      (set->devices.size() == 1 && set->device->backend() == transport::Backend::kInproc)) {
    set->cq = set->device->CreateCompletionQueue();
    return;
  }
  std::vector<transport::Device*> drivers;
  for (const auto& d : set->devices) drivers.push_back(d.get());
  set->driver = std::make_unique<MultiDeviceDriver>(std::move(drivers));
  set->cq = std::make_unique<transport::CompletionQueue>(
      set->device->options().progress == transport::ProgressMode::kCaller ? set->driver.get()
                                                                          : nullptr);
}

void FindMailboxes(const ConnectionSpec& spec, ConnectionSet* set) {
  set->mailboxes.assign(spec.n, nullptr);
  set->mailboxes_ready = spec.mailboxes && !set->conns.empty() && spec.n > 1;
  for (int r = 0; r < spec.n && set->mailboxes_ready; ++r) {
    if (r == spec.rank) continue;
    set->mailboxes[r] = set->conns[0][r] ? set->conns[0][r]->mailbox() : nullptr;
    set->mailboxes_ready = set->mailboxes[r] != nullptr;
  }
  if (!set->mailboxes_ready) set->mailboxes.assign(spec.n, nullptr);
}

absl::Status ConnectAll(transport::Rendezvous& rendezvous, const ConnectionSpec& spec,
                        ConnectionSet* set, transport::CompletionQueue* cq,
                        const absl::Status& opened, std::string_view note, const NoteCheck& check) {
  const int n = spec.n;
  const int rank = spec.rank;
  const absl::Time deadline = absl::Now() + spec.timeout;
  if (n == 1) return opened;
  std::vector<transport::Device*> device_of(n, nullptr);
  absl::Status mine = opened;
  for (int r = 0; r < n && mine.ok(); ++r) {
    if (r == rank) continue;
    for (const auto& d : set->devices) {
      if (spec.caller_device != nullptr || d->backend() == spec.peer_backend[r]) {
        device_of[r] = d.get();
      }
    }
    if (device_of[r] == nullptr) {
      mine = absl::InternalError(absl::StrCat("rank ", rank, ": no device for rank ", r));
    }
  }
  auto kept = [&](int c, int r) {
    return static_cast<size_t>(c) < spec.keep.size() && spec.keep[c][r];
  };
  // Per channel: the peers connected anew (null: this rank, or a connection kept).
  auto device_on = [&](int c) {
    std::vector<transport::Device*> out = device_of;
    for (int r = 0; r < n; ++r) {
      if (kept(c, r)) out[r] = nullptr;
    }
    return out;
  };
  auto source = [&](int c) {
    return spec.channel_local_addresses.empty() || spec.caller_device != nullptr
               ? std::string()
               : spec.channel_local_addresses[c % spec.channel_local_addresses.size()];
  };
  // What this rank publishes, one line each: "ok|<note>" (or "error|<why>" when its devices did
  // not open, or a channel could not listen), then every channel's listening record.
  auto one_line = [](std::string_view text) {
    std::string out(text);
    std::replace(out.begin(), out.end(), '\n', ' ');
    return out;
  };
  std::vector<PeerListeners> listening;
  for (int c = 0; c < spec.channels && mine.ok(); ++c) {
    auto l = ListenForPeers(rank, device_on(c), source(c));
    if (!l.ok()) {
      mine =
          absl::Status(l.status().code(), absl::StrCat("channel ", c, ": ", l.status().message()));
      break;
    }
    listening.push_back(*std::move(l));
  }
  std::string published = mine.ok() ? absl::StrCat("ok|", one_line(note))
                                    : absl::StrCat("error|", one_line(std::string(mine.message())));
  for (const PeerListeners& l : listening) absl::StrAppend(&published, "\n", l.record);
  // One store exchange for every channel (and the caller's note).
  PLEXUS_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      rendezvous.AllGather(absl::StrCat("plexus/coll/peers/", spec.tag), published, spec.timeout));
  std::vector<std::vector<std::string>> lines(n);
  std::vector<std::string> notes(n);
  for (int r = 0; r < n; ++r) {
    lines[r] = absl::StrSplit(gathered[r], '\n');
    const std::string& head = lines[r][0];
    if (absl::StartsWith(head, "error|")) {
      return absl::UnavailableError(
          absl::StrCat("rank ", r, " could not open its connections: ", head.substr(6)));
    }
    if (!absl::StartsWith(head, "ok|") || static_cast<int>(lines[r].size()) != spec.channels + 1) {
      return absl::DataLossError(absl::StrCat("rank ", r, " published '", gathered[r],
                                              "' (expected ", spec.channels,
                                              " channel record(s): do the ranks agree on "
                                              "the channels?)"));
    }
    notes[r] = head.substr(3);
  }
  if (check) PLEXUS_RETURN_IF_ERROR(check(notes));
  std::vector<std::string> records(n);
  for (int c = 0; c < spec.channels; ++c) {
    for (int r = 0; r < n; ++r) records[r] = lines[r][c + 1];
    auto mesh =
        ConnectListening(rank, listening[c], records, device_on(c), cq, deadline, source(c));
    if (!mesh.ok()) {
      return absl::Status(mesh.status().code(),
                          absl::StrCat("connecting channel ", c, " of the communicator: ",
                                       std::string(mesh.status().message())));
    }
    for (int r = 0; r < n; ++r) {
      if ((*mesh)[r]) set->peer_of_connection[(*mesh)[r]->id()] = r;
    }
    set->conns.push_back(*std::move(mesh));
  }
  return absl::OkStatus();
}

ConnectionSpec CommunicatorImpl::MakeConnectionSpec(
    const std::vector<std::vector<transport::Backend>>& pairs, std::string tag) const {
  ConnectionSpec spec;
  spec.rank = layout_.rank;
  spec.n = layout_.n;
  spec.peer_backend = pairs[layout_.rank];
  bool all_mailboxes = use_mailboxes_;
  for (size_t a = 0; a < pairs.size(); ++a) {
    for (size_t b = 0; b < pairs.size(); ++b) {
      all_mailboxes = all_mailboxes && (a == b || pairs[a][b] == transport::Backend::kShm ||
                                        pairs[a][b] == transport::Backend::kInproc);
    }
  }
  spec.mailboxes = all_mailboxes;
  spec.device_options = device_options_;
  spec.caller_device = caller_device_ && !conns_.devices.empty() ? conns_.devices.front() : nullptr;
  spec.channels = options_.channels;
  spec.channel_local_addresses = options_.channel_local_addresses;
  spec.tag = std::move(tag);
  spec.timeout = options_.connect_timeout;
  return spec;
}

namespace {

// The order OpenDevices creates devices in (shm before tcp: MultiDeviceDriver drives the last
// one blocking).
std::vector<transport::Device*> DriveOrder(std::vector<transport::Device*> devices) {
  std::stable_sort(devices.begin(), devices.end(), [](transport::Device* a, transport::Device* b) {
    return static_cast<int>(a->backend()) < static_cast<int>(b->backend());
  });
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  return devices;
}

std::vector<transport::Device*> Raw(absl::Span<const std::shared_ptr<transport::Device>> devices) {
  std::vector<transport::Device*> out;
  for (const auto& d : devices) out.push_back(d.get());
  return out;
}

// "rank 0 had sent 1 point-to-point message(s) to rank 1, which had received 0" when a pair
// whose connections change (`changes`[a][b]) has a Send whose Recv has not run: it would wait
// on the new connections for a message that arrived on the old ones. notes[r]: rank r's counts,
// "sent to 0,1,...|received from 0,1,...".
absl::Status CheckPointToPoint(absl::Span<const std::string> notes,
                               const std::vector<std::vector<bool>>& changes) {
  const int n = static_cast<int>(notes.size());
  std::vector<std::vector<uint64_t>> sent(n), received(n);
  for (int r = 0; r < n; ++r) {
    const std::vector<std::string> fields = absl::StrSplit(notes[r], '|');
    bool ok = fields.size() == 2;
    for (int k = 0; ok && k < 2; ++k) {
      auto& into = k == 0 ? sent[r] : received[r];
      for (absl::string_view v : absl::StrSplit(fields[k], ',')) {
        uint64_t x = 0;
        ok = ok && absl::SimpleAtoi(v, &x);
        into.push_back(x);
      }
      ok = ok && static_cast<int>(into.size()) == n;
    }
    if (!ok) {
      return absl::DataLossError(
          absl::StrCat("rank ", r, "'s point-to-point counts '", notes[r], "' are malformed"));
    }
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b || !changes[a][b] || sent[a][b] == received[b][a]) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", a, " had sent ", sent[a][b], " point-to-point message(s) to rank ", b,
          ", which had received ", received[b][a],
          ": a Send and its Recv straddle the change of their connections (finish both before "
          "the collective the change lands on)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CommunicatorImpl::ChangeConnections(const std::optional<TransportChoice>& transport,
                                                 std::optional<int> channels, uint64_t epoch) {
  const int n = layout_.n;
  const int rank = layout_.rank;
  const TransportChoice current{options_.device.backend, options_.transport_policy};
  const TransportChoice choice = transport.value_or(current);
  const int old_channels = options_.channels;
  const int new_channels = channels.value_or(old_channels);
  const auto pairs =
      transport ? PairBackends(choice.policy, choice.backend, hosts_) : pair_backends_;
  auto record = [&] {
    options_.device.backend = choice.backend;
    options_.transport_policy = choice.policy;
    options_.channels = new_channels;
    layout_.channels = new_channels;
    call_layout_.channels = new_channels;
    executor_.SetChannels(new_channels);
    reconfig_.UpdateActive([&](ActiveConfiguration& active) {
      active.transport = choice;
      active.peer_backends = peer_backend_;
      active.channels = new_channels;
      active.connected_channels = new_channels;
    });
  };
  // Every rank derives the same matrix and channel count: all of them reconnect, or none does.
  if ((pairs == pair_backends_ && new_channels == old_channels) || n == 1) {
    record();
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  std::string what;
  if (transport && pairs != pair_backends_) {
    what = absl::StrCat("changing the transport to ", TransportChoiceText(choice));
  }
  if (new_channels != old_channels) {
    absl::StrAppend(&what, what.empty() ? "changing" : " and", " the channels from ", old_channels,
                    " to ", new_channels);
  }
  const std::string where = absl::StrCat("rank ", rank, ": live reconfiguration epoch ", epoch, " ",
                                         what, " at collective ", collective_seq_);
  // Which connections change: every one of a pair whose backend changes, and the channels added
  // or dropped. The rest (channel c < min(old, new) of a pair whose backend stays) move over.
  std::vector<std::vector<bool>> changes(n, std::vector<bool>(n, false));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      changes[a][b] =
          a != b && (pairs[a][b] != pair_backends_[a][b] || new_channels != old_channels);
    }
  }
  ConnectionSpec spec = MakeConnectionSpec(pairs, absl::StrCat(uid_, "/connections/", epoch));
  spec.channels = new_channels;
  spec.keep.assign(new_channels, std::vector<bool>(n, false));
  bool any_kept = false;
  for (int c = 0; c < std::min(old_channels, new_channels); ++c) {
    for (int r = 0; r < n; ++r) {
      spec.keep[c][r] = r != rank && pairs[rank][r] == pair_backends_[rank][r];
      any_kept = any_kept || spec.keep[c][r];
    }
  }
  const std::vector<transport::Device*> old_devices = Raw(conns_.devices);
  auto fail = [&](absl::Status s) {
    absl::Status status(s.code(), absl::StrCat(where, ": ", s.message()));
    issue_.Break(status);
    // The old connections go too, so that a peer blocked on them fails at once.
    conns_.Close();
    if (conns_.driver != nullptr) conns_.driver->SetDevices(old_devices);  // the new set's go
    return status;
  };
  auto rendezvous = transport::Rendezvous::Create(rank, n, store_);
  if (!rendezvous.ok()) return fail(rendezvous.status());
  ConnectionSet next;
  absl::Status opened = OpenDevices(spec, conns_.devices, &next);
  // Kept connections stay on this communicator's queue, which the new connections join: its
  // driver drives the old devices and the new ones until the swap.
  transport::CompletionQueue* cq = conns_.cq.get();
  if (!any_kept) {
    MakeQueue(spec, &next);
    cq = next.cq.get();
  } else if (conns_.driver != nullptr) {
    std::vector<transport::Device*> both = old_devices;
    for (const auto& d : next.devices) both.push_back(d.get());
    conns_.driver->SetDevices(DriveOrder(std::move(both)));
  } else if (opened.ok() && DriveOrder(Raw(next.devices)) != DriveOrder(old_devices) &&
             conns_.cq != nullptr && conns_.device != nullptr &&
             conns_.device->options().progress == transport::ProgressMode::kCaller) {
    // Not reached: a queue without a driver (the caller's device, inproc) keeps its devices.
    opened = absl::InternalError("the completion queue cannot drive the new devices");
  }
  const absl::Time devices_opened = absl::Now();
  // One store exchange: every rank's listening addresses, whether its devices opened, and how
  // many point-to-point messages it has sent to and received from each peer. It is also the
  // barrier that makes closing the dropped connections safe: a rank contributes when it starts
  // the landing collective, so once it completes every rank has finished every collective before
  // it, and every message of those arrived.
  const std::string note =
      absl::StrCat(absl::StrJoin(p2p_send_seq_, ","), "|", absl::StrJoin(p2p_recv_seq_, ","));
  auto check = [&](absl::Span<const std::string> notes) {
    return CheckPointToPoint(notes, changes);
  };
  if (absl::Status s = ConnectAll(*rendezvous, spec, &next, cq, opened, note, check); !s.ok()) {
    return fail(s);
  }
  const absl::Time connected = absl::Now();
  ConnectionSet old = std::move(conns_);
  int made = 0, kept = 0;
  for (int c = 0; c < new_channels; ++c) {
    for (int r = 0; r < n; ++r) {
      if (spec.keep[c][r]) {
        next.conns[c][r] = std::move(old.conns[c][r]);
        next.peer_of_connection[next.conns[c][r]->id()] = r;
        ++kept;
      } else if (next.conns[c][r] != nullptr) {
        ++made;
      }
    }
  }
  if (any_kept) {
    next.cq = std::move(old.cq);
    next.driver = std::move(old.driver);
    if (next.driver != nullptr) next.driver->SetDevices(DriveOrder(Raw(next.devices)));
  }
  FindMailboxes(spec, &next);
  conns_ = std::move(next);
  connections_opened_.fetch_add(made, std::memory_order_relaxed);
  // Nothing is posted on the dropped connections and nothing is in flight on them (the gather
  // above): close them; `old` releases the devices no longer used as it goes.
  int closed = 0;
  for (auto& channel : old.conns) {
    for (auto& c : channel) closed += c != nullptr ? 1 : 0;
  }
  old.Close();
  old = ConnectionSet();
  pair_backends_ = pairs;
  peer_backend_ = pairs[rank];
  peer_backend_[rank] = choice.backend;
  if (use_default_table_) {
    bool any_tcp = false;
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        any_tcp = any_tcp || (a != b && pairs[a][b] == transport::Backend::kTcp);
      }
    }
    table_ = AlgorithmTable::Default(any_tcp);
  }
  record();
  if (debug_) {
    const absl::Time end = absl::Now();
    base::Logf(base::LogLevel::kInfo,
               "[plexus-coll rank %d] epoch %llu: %s in %s (devices opened in %s; one store "
               "exchange and %d connection(s) made in %s, %d kept; %d closed in %s)",
               rank, static_cast<unsigned long long>(epoch), what.c_str(),
               absl::FormatDuration(end - start).c_str(),
               absl::FormatDuration(devices_opened - start).c_str(), made,
               absl::FormatDuration(connected - devices_opened).c_str(), kept, closed,
               absl::FormatDuration(end - connected).c_str());
  }
  return absl::OkStatus();
}

}  // namespace plexus::collectives::internal
