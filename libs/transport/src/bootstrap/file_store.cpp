// FileStore: one file per key in a shared directory. Writers create a temporary file and rename
// it over the key's file, so a reader sees the old value or the new one, never a mix.
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bootstrap/store_keys.hpp"
#include "plexus/base/hash.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

namespace net = base::net;

namespace {

using net::ErrnoText;

// Key files never start with '.': the lock file and temporary files do.
constexpr char kLockName[] = ".plexus-store.lock";
constexpr size_t kMaxEncodedName = 200;

// [A-Za-z0-9_-] stay, every other byte becomes %XX; names too long for a file system keep a
// readable prefix and a 128-bit hash of the whole key.
std::string EncodeFileName(std::string_view key) {
  std::string name;
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      name.push_back(static_cast<char>(c));
    } else {
      name += absl::StrFormat("%%%02X", c);
    }
  }
  if (name.size() > kMaxEncodedName) {
    name = absl::StrFormat("%s~%016x%016x", name.substr(0, 100), base::Fnv1a64(key),
                           base::Fnv1a64(key, 0x84222325cbf29ce4ull));
  }
  return name;
}

absl::Status ReadWholeFile(const std::string& path, std::string* out, bool* missing) {
  *missing = false;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      *missing = true;
      return absl::OkStatus();
    }
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", ErrnoText(errno)));
  }
  out->clear();
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      if (out->size() > kMaxStoreValueBytes) {
        close(fd);
        return absl::OutOfRangeError(absl::StrCat(path, " holds more than ", kMaxStoreValueBytes,
                                                  " bytes: not written by a plexus store"));
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = errno;
    close(fd);
    if (n < 0)
      return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", ErrnoText(err)));
    return absl::OkStatus();
  }
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The delays between polls of a key: fast at first (a key usually appears soon), then at most
// 50 ms.
base::Backoff PollBackoff() {
  return base::Backoff(absl::Microseconds(500), absl::Milliseconds(50));
}

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(std::string directory) {
  if (directory.empty()) {
    return absl::InvalidArgumentError(
        "file store directory is empty (set PLEXUS_STORE_PATH to a "
        "directory every rank can reach)");
  }
  while (directory.size() > 1 && directory.back() == '/') directory.pop_back();
  // mkdir -p, tolerating other ranks creating the same directories at the same time.
  for (size_t pos = 1; pos <= directory.size(); ++pos) {
    if (pos == directory.size() || directory[pos] == '/') {
      const std::string prefix = directory.substr(0, pos);
      if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(absl::StrCat("cannot create the file store directory ",
                                                        prefix, ": ", ErrnoText(errno)));
      }
    }
  }
  struct stat st;
  if (stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("file store path ", directory, " is not a directory"));
  }
  const std::string lock_path = absl::StrCat(directory, "/", kLockName);
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write in the file store directory ",
                                                    directory, " (", lock_path, ": ",
                                                    ErrnoText(errno), ")"));
  }
  return std::unique_ptr<FileStore>(new FileStore(std::move(directory), fd));
}

FileStore::~FileStore() { close(lock_fd_); }

std::string FileStore::description() const { return absl::StrCat("file store at ", directory_); }

absl::StatusOr<std::string> FileStore::PathOf(std::string_view key) const {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  return absl::StrCat(directory_, "/", EncodeFileName(key));
}

namespace {

absl::Status WriteAtomically(const std::string& directory, const std::string& path,
                             std::string_view value) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::minstd_rand rng(std::random_device{}());
  const std::string tmp =
      absl::StrCat(directory, "/.tmp.", getpid(), ".", counter.fetch_add(1), ".", rng());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", tmp, ": ", ErrnoText(errno)));
  }
  size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", ErrnoText(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FileStore::Set(std::string_view key, std::string_view value) {
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key '", std::string(key), "' has ",
                                                   value.size(), " bytes; the limit is ",
                                                   kMaxStoreValueBytes));
  }
  PLEXUS_ASSIGN_OR_RETURN(auto path, PathOf(key));
  return WriteAtomically(directory_, path, value);
}

absl::StatusOr<std::string> FileStore::Get(std::string_view key, absl::Duration timeout) {
  PLEXUS_ASSIGN_OR_RETURN(auto path, PathOf(key));
  const absl::Time deadline = DeadlineAfter(timeout);
  base::Backoff backoff = PollBackoff();
  std::string value;
  for (;;) {
    bool missing = false;
    PLEXUS_RETURN_IF_ERROR(ReadWholeFile(path, &value, &missing));
    if (!missing) return value;
    if (!backoff.SleepBefore(deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key '", std::string(key), "' was not set within ", absl::FormatDuration(timeout),
          " in the ", description(), " (file ", path, ")"));
    }
  }
}

absl::StatusOr<int64_t> FileStore::Add(std::string_view key, int64_t delta) {
  PLEXUS_ASSIGN_OR_RETURN(auto path, PathOf(key));
  std::lock_guard<std::mutex> guard(add_mu_);
  while (flock(lock_fd_, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("cannot lock ", directory_, "/", kLockName, ": ", ErrnoText(errno)));
    }
  }
  struct Unlock {
    int fd;
    ~Unlock() { flock(fd, LOCK_UN); }
  } unlock{lock_fd_};
  std::string text;
  bool missing = false;
  PLEXUS_RETURN_IF_ERROR(ReadWholeFile(path, &text, &missing));
  int64_t current = 0;
  if (!missing && !absl::SimpleAtoi(text, &current)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", std::string(key), "' holds a value that is not a counter in the ", description()));
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter '", std::string(key), "' would overflow in the ", description()));
  }
  const int64_t next = current + delta;
  PLEXUS_RETURN_IF_ERROR(WriteAtomically(directory_, path, std::to_string(next)));
  return next;
}

absl::Status FileStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  std::vector<std::string> paths;
  for (const std::string& k : keys) {
    PLEXUS_ASSIGN_OR_RETURN(auto path, PathOf(k));
    paths.push_back(std::move(path));
  }
  const absl::Time deadline = DeadlineAfter(timeout);
  base::Backoff backoff = PollBackoff();
  size_t present = 0;  // keys never disappear while waited for in a rendezvous: check in order
  for (;;) {
    while (present < paths.size() && Exists(paths[present])) ++present;
    if (present == paths.size()) return absl::OkStatus();
    if (!backoff.SleepBefore(deadline)) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < paths.size(); ++i) {
        if (!Exists(paths[i])) missing.push_back(absl::StrCat("'", keys[i], "'"));
      }
      if (missing.empty()) return absl::OkStatus();
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", absl::FormatDuration(timeout), " waiting in the ", description(),
          ": missing ", missing.size() == 1 ? "key " : "keys ", absl::StrJoin(missing, ", ")));
    }
  }
}

absl::StatusOr<bool> FileStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& k : keys) {
    PLEXUS_ASSIGN_OR_RETURN(auto path, PathOf(k));
    if (!Exists(path)) return false;
  }
  return true;
}

absl::StatusOr<bool> FileStore::Delete(std::string_view key) {
  PLEXUS_ASSIGN_OR_RETURN(auto path, PathOf(key));
  if (unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return absl::UnavailableError(absl::StrCat("cannot delete ", path, ": ", ErrnoText(errno)));
}

}  // namespace plexus::transport
