// The pinned-buffer cache behind device-buffer collectives (src/staging.hpp), with a counting
// host allocator standing in for cudaMallocHost: reuse, size classes, the byte bound, errors.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>

#include "staging.hpp"

namespace pi = plexus::collectives::internal;

namespace {

struct CountingAllocator {
  std::set<void*> live;
  int allocs = 0, frees = 0;
  bool fail = false;
  pi::PinnedPool Pool() {
    return pi::PinnedPool(
        [this](size_t n) -> void* {
          if (fail) return nullptr;
          void* p = std::malloc(n);
          live.insert(p);
          ++allocs;
          return p;
        },
        [this](void* p) {
          REQUIRE(live.erase(p) == 1);  // never a double or foreign free
          std::free(p);
          ++frees;
        });
  }
};

constexpr size_t kMiB = size_t{1} << 20;

}  // namespace

TEST_CASE("pinned pool: buffers are reused across calls and freed with the pool",
          "[collectives][staging]") {
  CountingAllocator a;
  {
    pi::PinnedPool pool = a.Pool();
    for (int call = 0; call < 10; ++call) {
      auto in = pool.Acquire(3 * kMiB);
      auto out = pool.Acquire(3 * kMiB);
      REQUIRE(in.ok());
      REQUIRE(out.ok());
      CHECK(in->capacity == 4 * kMiB);  // rounded up to a power of two
      CHECK(in->data != out->data);
      pool.Release(*in, 64 * kMiB);
      pool.Release(*out, 64 * kMiB);
    }
    CHECK(a.allocs == 2);  // the first call's two buffers serve every later call
    CHECK(pool.allocations() == 2);
    CHECK(pool.cached_bytes() == 8 * kMiB);
    // A smaller call takes the smallest cached buffer that fits; a tiny one gets 64 KiB at least.
    auto small = pool.Acquire(100);
    REQUIRE(small.ok());
    CHECK(small->capacity == 4 * kMiB);
    pool.Release(*small, 64 * kMiB);
    CHECK(a.frees == 0);
  }
  CHECK(a.frees == 2);
  CHECK(a.live.empty());
}

TEST_CASE("pinned pool: the cache never holds more than the bound", "[collectives][staging]") {
  CountingAllocator a;
  pi::PinnedPool pool = a.Pool();
  auto b1 = pool.Acquire(kMiB), b2 = pool.Acquire(2 * kMiB), b3 = pool.Acquire(4 * kMiB);
  REQUIRE((b1.ok() && b2.ok() && b3.ok()));
  pool.Release(*b1, 6 * kMiB);
  pool.Release(*b2, 6 * kMiB);
  CHECK(pool.cached_bytes() == 3 * kMiB);
  pool.Release(*b3, 6 * kMiB);  // 7 MiB would exceed 6: the smallest (1 MiB) goes
  CHECK(pool.cached_bytes() == 6 * kMiB);
  CHECK(a.frees == 1);
  auto big = pool.Acquire(16 * kMiB);  // larger than the bound: freed at once on release
  REQUIRE(big.ok());
  pool.Release(*big, 6 * kMiB);
  CHECK(pool.cached_bytes() == 6 * kMiB);
  CHECK(a.frees == 2);
  // A bound of 0 caches nothing.
  auto c = pool.Acquire(kMiB);
  REQUIRE(c.ok());
  CHECK(c->capacity == 2 * kMiB);  // served from the cache
  pool.Release(*c, 0);
  CHECK(pool.cached_bytes() == 4 * kMiB);
  CHECK(a.frees == 3);
}

TEST_CASE("pinned pool: an allocation failure is an error naming the size",
          "[collectives][staging]") {
  CountingAllocator a;
  pi::PinnedPool pool = a.Pool();
  a.fail = true;
  auto b = pool.Acquire(5 * kMiB);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(b.status().message()).find("8388608 bytes of pinned host memory") !=
        std::string::npos);
  CHECK(std::string(b.status().message()).find("5242880-byte device buffer") != std::string::npos);
}
