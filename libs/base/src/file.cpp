#include "plexus/base/file.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace plexus::base {
namespace {

absl::Status FileError(int err, const std::string& path, std::string_view what) {
  const std::string message =
      absl::StrCat("cannot ", std::string(what), " '", path, "': ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EISDIR:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, path, "open");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return FileError(err, path, "stat");
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a directory; expected a file"));
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", st.st_size, " bytes, more than the limit of ", max_bytes));
  }
  std::string content;
  if (S_ISREG(st.st_mode)) content.reserve(static_cast<size_t>(st.st_size));
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return FileError(err, path, "read");
    }
    if (n == 0) break;
    if (content.size() + static_cast<size_t>(n) > max_bytes) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is larger than the limit of ", max_bytes, " bytes"));
    }
    content.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return content;
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view content) {
  std::string tmp = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkstemp(tmp.data());
  if (fd < 0) return FileError(errno, tmp, "create");
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      unlink(tmp.c_str());
      return FileError(err, tmp, "write");
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return FileError(err, tmp, "flush");
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return FileError(err, path, "replace");
  }
  return absl::OkStatus();
}

}  // namespace plexus::base
