#include "plexus/transport/matcher.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "produce_consume.hpp"

namespace plexus::transport {
namespace {

// Blocks from this size are mapped (and unmapped when freed) instead of taken from malloc.
constexpr size_t kMapBytes = size_t{256} << 10;

}  // namespace

bool HoldBudget::TryReserve(size_t bytes) {
  size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > cap_ || used > cap_ - bytes) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

void HoldBudget::Release(size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

HeldBytes& HeldBytes::operator=(HeldBytes&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

bool HeldBytes::Allocate(size_t bytes) {
  Reset();
  if (bytes == 0) return true;
  if (bytes >= kMapBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<uint8_t*>(p);
    mapped_ = true;
  } else {
    data_ = new (std::nothrow) uint8_t[bytes];
    if (data_ == nullptr) return false;
  }
  capacity_ = bytes;
  return true;
}

void HeldBytes::Reset() {
  if (data_ != nullptr) {
    if (mapped_) {
      munmap(data_, capacity_);
    } else {
      delete[] data_;
    }
  }
  data_ = nullptr;
  capacity_ = 0;
  mapped_ = false;
}

Matcher::Matcher(MatcherConfig config, CompleteFn complete)
    : config_(std::move(config)), complete_(std::move(complete)), eager_(config_.deliver_eagerly) {}

Matcher::~Matcher() {
  held_.clear();
  spares_.clear();
  if (config_.device != nullptr && device_used_ > 0) config_.device->Release(device_used_);
}

absl::Status Matcher::TooLong(size_t message, size_t buffer, uint64_t wr_id) const {
  return absl::ResourceExhaustedError(
      absl::StrCat(config_.backend, ": message of ", message, " bytes from ", config_.peer,
                   " is longer than the posted receive of ", buffer, " bytes (wr_id ", wr_id, "); ",
                   config_.after_too_long));
}

absl::Status Matcher::TooLargeToHold(size_t length, size_t cap, bool device) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      config_.backend, ": peer ", config_.peer, " sent a message of ", length,
      recvs_.empty() ? " bytes while no receive is posted"
                     : " bytes for a consumed receive, which this backend stages whole",
      "; holding it would exceed the ", device ? "device's" : "connection's", " cap of ", cap,
      " bytes for held messages (raise ",
      device ? "DeviceOptions::max_held_bytes_per_device or PLEXUS_MAX_HELD_BYTES_PER_DEVICE"
             : "DeviceOptions::max_held_bytes_per_connection or "
               "PLEXUS_MAX_HELD_BYTES_PER_CONNECTION",
      recvs_.empty() ? ", or post the receive before the peer sends)" : ")"));
}

// Accounting: used_ (the connection's cap) counts held messages, their overheads and spare
// buffers; the device's budget counts held messages and overheads only (device_used_ is this
// connection's share), so that idle spares of one connection never make another one wait.
bool Matcher::Reserve(size_t bytes) {
  const size_t cap = config_.connection_cap;
  if (bytes > cap || used_ > cap - bytes) {
    DropSpares();
    if (bytes > cap || used_ > cap - bytes) return false;
  }
  if (config_.device != nullptr && !config_.device->TryReserve(bytes)) return false;
  used_ += bytes;
  device_used_ += bytes;
  return true;
}

void Matcher::Unreserve(size_t bytes) {
  used_ -= bytes;
  device_used_ -= bytes;
  if (config_.device != nullptr) config_.device->Release(bytes);
}

void Matcher::DropSpares() {
  used_ -= spare_bytes_;
  spares_.clear();
  spare_bytes_ = 0;
}

bool Matcher::TakeBuffer(size_t length, HeldBytes* out) {
  size_t best = spares_.size();
  for (size_t i = 0; i < spares_.size(); ++i) {
    const size_t cap = spares_[i].capacity();
    if (cap >= length && (best == spares_.size() || cap < spares_[best].capacity())) best = i;
  }
  if (best < spares_.size()) {
    const size_t cap = spares_[best].capacity();
    if (config_.device == nullptr || config_.device->TryReserve(cap)) {
      device_used_ += cap;  // already in used_
      *out = std::move(spares_[best]);
      spares_[best] = std::move(spares_.back());
      spares_.pop_back();
      spare_bytes_ -= cap;
      return true;
    }
  }
  if (!Reserve(length)) return false;
  if (!out->Allocate(length)) {
    Unreserve(length);
    return false;
  }
  return true;
}

void Matcher::GiveBack(HeldBytes bytes) {
  const size_t cap = bytes.capacity();
  if (cap == 0) return;
  if (failed_ || cap > config_.max_spare_bytes) {
    Unreserve(cap);
    return;
  }
  while (!spares_.empty() && spare_bytes_ + cap > config_.max_spare_bytes) {
    // Drop the smallest spare: large messages are the ones worth keeping memory for.
    size_t smallest = 0;
    for (size_t i = 1; i < spares_.size(); ++i) {
      if (spares_[i].capacity() < spares_[smallest].capacity()) smallest = i;
    }
    if (spares_[smallest].capacity() >= cap) {
      Unreserve(cap);
      return;
    }
    spare_bytes_ -= spares_[smallest].capacity();
    used_ -= spares_[smallest].capacity();
    spares_[smallest] = std::move(spares_.back());
    spares_.pop_back();
  }
  // Kept as a spare: it leaves the device's budget, stays in the connection's.
  device_used_ -= cap;
  if (config_.device != nullptr) config_.device->Release(cap);
  spare_bytes_ += cap;
  spares_.push_back(std::move(bytes));
}

absl::StatusOr<Matcher::Admission> Matcher::Admit(size_t length, Slot* slot) {
  if (!recvs_.empty()) {
    Recv& front = recvs_.front();
    if (length > front.buffer.size) {
      const uint64_t wr_id = front.wr_id;
      absl::Status too_long = TooLong(length, front.buffer.size, wr_id);
      recvs_.pop_front();
      complete_(wr_id, too_long, 0);
      return too_long;
    }
    if (front.consumer == nullptr || config_.stream_consumers) {
      Recv r = std::move(front);
      recvs_.pop_front();
      *slot = Slot{
          static_cast<uint8_t*>(r.buffer.data), length, false, 0, r.wr_id, std::move(r.consumer)};
      return Admission::kAdmitted;
    }
    // A consumed receive on a backend that does not stream: the message is held (every held
    // message is claimed while receives wait), claimed by it, and consumed once whole.
  }
  // Checked before anything is allocated: the length is the peer's word.
  if (length > config_.connection_cap - kHeldMessageOverhead) {
    return TooLargeToHold(length, config_.connection_cap, false);
  }
  if (config_.device != nullptr && length > config_.device->cap() - kHeldMessageOverhead) {
    return TooLargeToHold(length, config_.device->cap(), true);
  }
  if (!Reserve(kHeldMessageOverhead)) return Admission::kWait;
  Held h;
  h.length = length;
  if (length > 0 && !TakeBuffer(length, &h.bytes)) {
    Unreserve(kHeldMessageOverhead);
    return Admission::kWait;
  }
  *slot = Slot{h.bytes.data(), length, true, front_ticket_ + held_.size(), 0, nullptr};
  if (!recvs_.empty()) {
    Recv r = std::move(recvs_.front());
    recvs_.pop_front();
    h.claimed = true;
    h.wr_id = r.wr_id;
    h.consumer = std::move(r.consumer);
    ++claimed_;
  }
  held_.push_back(std::move(h));
  return Admission::kAdmitted;
}

void Matcher::Deliver(Held& h) {
  if (!h.rejected && h.consumer != nullptr) {
    absl::Status consumed = internal::ConsumeRange(
        *h.consumer, 0, absl::MakeConstSpan(h.bytes.data(), h.length), h.length);
    if (!consumed.ok()) {
      consumed = absl::Status(consumed.code(),
                              absl::StrCat(config_.backend, ": receive (wr_id ", h.wr_id, ") from ",
                                           config_.peer, ": ", consumed.message()));
      if (consumer_error_.ok()) consumer_error_ = consumed;
    }
    complete_(h.wr_id, consumed, consumed.ok() ? h.length : 0);
    h.consumer.reset();
  } else if (!h.rejected) {
    if (h.length > 0) std::memcpy(h.recv.data, h.bytes.data(), h.length);
    complete_(h.wr_id, absl::OkStatus(), h.length);
  }
  GiveBack(std::move(h.bytes));
  Unreserve(kHeldMessageOverhead);
}

bool Matcher::DeliverOldest() {
  if (held_.empty() || claimed_ == 0 || !held_.front().whole) return false;
  Deliver(held_.front());
  held_.pop_front();
  --claimed_;
  ++front_ticket_;
  return true;
}

void Matcher::DeliverReady() {
  while (DeliverOldest()) {
  }
}

absl::Status Matcher::Placed(const Slot& slot) {
  if (!slot.held) {
    complete_(slot.wr_id, absl::OkStatus(), slot.length);
    return absl::OkStatus();
  }
  const uint64_t index = slot.ticket - front_ticket_;
  if (index >= held_.size()) return absl::OkStatus();  // dropped by Fail
  held_[index].whole = true;
  if (eager_) DeliverReady();
  return TakeConsumerError();
}

std::optional<size_t> Matcher::PeekNext(MutableBuffer head) const {
  if (!recvs_.empty() || claimed_ >= held_.size()) return std::nullopt;
  const Held& h = held_[claimed_];
  if (!h.whole) return std::nullopt;
  const size_t n = std::min(head.size, h.length);
  if (n > 0) std::memcpy(head.data, h.bytes.data(), n);
  return h.length;
}

absl::Status Matcher::PostRecv(MutableBuffer buffer, uint64_t wr_id) {
  return Claim(buffer, wr_id, nullptr);
}

absl::Status Matcher::PostRecvConsumed(size_t max_length, Consumer consumer, uint64_t wr_id) {
  return Claim(MutableBuffer{nullptr, max_length}, wr_id,
               std::make_shared<Consumer>(std::move(consumer)));
}

absl::Status Matcher::Claim(MutableBuffer buffer, uint64_t wr_id,
                            std::shared_ptr<Consumer> consumer) {
  if (failed_ && !has_unclaimed()) return failure_;
  if (claimed_ < held_.size()) {
    Held& h = held_[claimed_++];
    h.claimed = true;
    absl::Status result;
    if (h.length > buffer.size) {
      h.rejected = true;
      result = TooLong(h.length, buffer.size, wr_id);
      complete_(wr_id, result, 0);
    } else {
      h.recv = buffer;
      h.wr_id = wr_id;
      h.consumer = std::move(consumer);
    }
    if (eager_) DeliverReady();
    if (result.ok()) result = TakeConsumerError();
    return result;
  }
  recvs_.push_back(Recv{buffer, wr_id, std::move(consumer)});
  return absl::OkStatus();
}

void Matcher::Fail(const absl::Status& why, bool keep_whole) {
  if (failed_) return;
  failed_ = true;
  failure_ = why;
  eager_ = true;
  DropSpares();
  // Receives complete in the order they were posted: those of whole messages first (claimed
  // messages form a prefix of held_), then those of messages cut off, then the waiting ones.
  DeliverReady();
  size_t whole = 0;
  while (keep_whole && whole < held_.size() && held_[whole].whole) ++whole;
  for (size_t i = whole; i < held_.size(); ++i) {
    Held& h = held_[i];
    if (h.claimed && !h.rejected) complete_(h.wr_id, why, 0);
    Unreserve(h.bytes.capacity() + kHeldMessageOverhead);
    h.bytes.Reset();
  }
  held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(whole), held_.end());
  claimed_ = std::min(claimed_, held_.size());
  for (const Recv& r : recvs_) complete_(r.wr_id, why, 0);
  recvs_.clear();
  consumer_error_ = absl::OkStatus();  // the connection is failing already
}

}  // namespace plexus::transport
