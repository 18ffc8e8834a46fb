#include "scalemm/io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "scalemm/status.hpp"

namespace scalemm::io {
namespace {

constexpr long kProcMagic = 0x9fa0, kSysfsMagic = 0x62656572, kDebugfsMagic = 0x64626720;

struct Target {
  std::string path, dir, base;
  bool exists = false;
  struct stat st {};
};

[[noreturn]] void refuse(std::string_view option, const std::string& path, const std::string& why) {
  throw Error(StatusCode::kIoError, std::string(option) + ": cannot write " + path + ": " + why);
}

std::string errno_text(int e) { return std::strerror(e); }

Target resolve(const std::string& path, std::string_view option) {
  if (path.empty()) refuse(option, "''", "expected a file name, got an empty path; add a file name");
  Target t;
  t.path = path;
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) == 0) {
    if (S_ISLNK(lst.st_mode)) {
      // Written through: the link stays, its final target is replaced.
      char real[PATH_MAX];
      if (!::realpath(path.c_str(), real))
        refuse(option, path,
               "it is a symlink whose target does not exist or that loops (" + errno_text(errno) +
                   "); remove the link or point it at a file in an existing folder");
      t.path = real;
    }
    if (::stat(t.path.c_str(), &t.st) != 0) refuse(option, path, errno_text(errno) + "; choose another path");
    t.exists = true;
  } else if (errno != ENOENT) {
    refuse(option, path, errno_text(errno) + "; choose another path");
  }
  if (t.exists) {
    const mode_t m = t.st.st_mode;
    if (S_ISDIR(m)) refuse(option, path, "expected a file name, got a folder; add a file name");
    if (S_ISCHR(m) || S_ISBLK(m))
      refuse(option, path, "it is a device node, and scalemm writes only regular files (it would replace the "
                           "device); choose a file path");
    if (S_ISFIFO(m)) refuse(option, path, "it is a FIFO (named pipe), not a regular file; choose a file path");
    if (S_ISSOCK(m)) refuse(option, path, "it is a socket, not a regular file; choose a file path");
    if (!S_ISREG(m)) refuse(option, path, "it is not a regular file; choose a file path");
  }
  const size_t slash = t.path.find_last_of('/');
  t.dir = slash == std::string::npos ? "." : slash == 0 ? "/" : t.path.substr(0, slash);
  t.base = slash == std::string::npos ? t.path : t.path.substr(slash + 1);
  if (t.base.empty() || t.base == "." || t.base == "..")
    refuse(option, path, "expected a file name, got a folder; add a file name");
  return t;
}

// mkstemp's template: a hidden name beside the target, unique per call (O_CREAT | O_EXCL).
std::string temp_template(const Target& t) {
  return t.dir + "/." + t.base.substr(0, 200) + ".scalemm-XXXXXX";
}

}  // namespace

std::string check_output(const std::string& path, std::string_view option, const std::vector<std::string>& inputs) {
  const Target t = resolve(path, option);
  if (t.exists) {
    for (const auto& in : inputs) {
      struct stat s {};
      if (!in.empty() && ::stat(in.c_str(), &s) == 0 && s.st_dev == t.st.st_dev && s.st_ino == t.st.st_ino)
        refuse(option, path, "it is the same file as the input " + in +
                                 ", which writing it would destroy; choose another output path");
    }
  }
  struct stat ds {};
  if (::stat(t.dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode))
    refuse(option, path, "the folder " + t.dir + " does not exist; create it or choose another path");
  struct statfs fs {};
  if (::statfs(t.dir.c_str(), &fs) == 0 &&
      (long(fs.f_type) == kProcMagic || long(fs.f_type) == kSysfsMagic || long(fs.f_type) == kDebugfsMagic))
    refuse(option, path, "the folder " + t.dir + " is in /proc, /sys or debugfs (the kernel's pseudo-files, not "
                         "storage); choose a path on a disk");
  if (::access(t.dir.c_str(), W_OK) != 0)
    refuse(option, path, "the folder " + t.dir + " is not writable; choose another path");
  if (t.exists && ::access(t.path.c_str(), W_OK) != 0)
    refuse(option, path, "the file is not writable (" + errno_text(errno) + "); choose another path");
  // The only sure test: create (and remove) the temporary file the write will use.
  std::string probe = temp_template(t);
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    refuse(option, path, "no file can be created in the folder " + t.dir + " (" + errno_text(errno) +
                             "); choose another path");
  ::close(fd);
  ::unlink(probe.c_str());
  return t.path;
}

void write_output(const std::string& path, const std::vector<std::string_view>& parts, std::string_view option) {
  const std::string target = check_output(path, option);
  const Target t = resolve(target, option);
  mode_t mode;
  if (t.exists) {
    mode = t.st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);  // read the umask (it can only be read by setting it)
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  std::string tmp = temp_template(t);
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    refuse(option, path, "cannot create a temporary file in " + t.dir + " (" + errno_text(errno) + ")");
  auto fail = [&](const std::string& why) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    refuse(option, path, why + " (" + errno_text(e) + ")");
  };
  for (std::string_view part : parts) {
    const char* p = part.data();
    size_t left = part.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing failed; is the disk full?");
      p += n;
      left -= size_t(n);
    }
  }
  if (::fchmod(fd, mode) != 0) fail("cannot set the file's permissions");
  if (::fsync(fd) != 0) fail("writing failed; is the disk full?");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    refuse(option, path, "writing failed (" + errno_text(errno) + "); is the disk full?");
  }
  if (::rename(tmp.c_str(), t.path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    refuse(option, path, "cannot move the finished file into place (" + errno_text(e) + ")");
  }
}

}  // namespace scalemm::io
