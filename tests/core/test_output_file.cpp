// io::write_output / io::check_output: the one path every output file takes (docs/reliability.md,
// "Output files"). Each case is a way an output path used to destroy or mis-write something.
#include <catch2/catch.hpp>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "scalemm/io/npy.hpp"
#include "scalemm/io/output_file.hpp"
#include "scalemm/status.hpp"

using namespace scalemm;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "scalemm-out-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(path), fs::directory_iterator())); }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void put(const std::string& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// The message of the Error(kIoError) that `f` throws ("" when it does not throw).
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kIoError);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("write_output replaces a regular file atomically, keeps its mode and leaves no temporary file",
          "[core][io]") {
  TempDir t;
  const std::string out = t / "d.npy";
  put(out, "old");
  ::chmod(out.c_str(), 0640);
  // A file of the user's with the name the old writer used for its temporary file stays untouched.
  put(out + ".tmp-scalemm", "mine");
  io::write_output(out, {"new ", "content"}, "--out");
  CHECK(slurp(out) == "new content");
  struct stat st {};
  REQUIRE(::stat(out.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);
  CHECK(slurp(out + ".tmp-scalemm") == "mine");
  CHECK(t.entries() == 2);  // no .scalemm-XXXXXX left behind
  io::write_output(t / "new.txt", {"x"});
  CHECK(slurp(t / "new.txt") == "x");
}

TEST_CASE("write_output writes through a symlink and refuses a dangling one by name", "[core][io]") {
  TempDir t;
  fs::create_directory(t / "real");
  put(t / "real/target.npy", "old");
  fs::create_symlink(t / "real/target.npy", t / "link.npy");
  io::NpyArray a;
  a.descr = "|u1";
  a.shape = {3};
  a.data = {1, 2, 3};
  io::write_npy(t / "link.npy", a, "--out");
  CHECK(fs::is_symlink(t / "link.npy"));
  CHECK(io::read_npy(t / "real/target.npy").data == a.data);
  CHECK(t.entries() == 2);
  fs::create_symlink(t / "missing/x.npy", t / "dangling.npy");
  const std::string why = refusal([&] { io::write_output(t / "dangling.npy", {"x"}, "--out"); });
  CHECK(why.find("--out: cannot write") != std::string::npos);
  CHECK(why.find("symlink whose target does not exist") != std::string::npos);
  CHECK(fs::is_symlink(t / "dangling.npy"));
}

TEST_CASE("write_output refuses device nodes, FIFOs, sockets and folders and leaves them in place", "[core][io]") {
  TempDir t;
  CHECK(refusal([] { io::write_output("/dev/null", {"x"}, "--out"); }).find("device node") != std::string::npos);
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  REQUIRE(::mkfifo((t / "fifo").c_str(), 0600) == 0);
  CHECK(refusal([&] { io::write_output(t / "fifo", {"x"}, "--out"); }).find("FIFO") != std::string::npos);
  CHECK(fs::is_fifo(t / "fifo"));
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock = t / "sock";
  if (sock.size() < sizeof(addr.sun_path)) {
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock.c_str());
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    CHECK(refusal([&] { io::write_output(sock, {"x"}, "--out"); }).find("socket") != std::string::npos);
    CHECK(fs::is_socket(sock));
  }
  ::close(s);
  CHECK(refusal([&] { io::write_output(t.path, {"x"}, "--out"); }).find("got a folder") != std::string::npos);
  CHECK(refusal([&] { io::write_output("", {"x"}, "--out"); }).find("empty path") != std::string::npos);
}

TEST_CASE("check_output refuses an output that is one of the inputs, also through a link", "[core][io]") {
  TempDir t;
  put(t / "a.npy", "input");
  fs::create_hard_link(t / "a.npy", t / "hard.npy");
  fs::create_symlink(t / "a.npy", t / "soft.npy");
  for (const std::string& out : {t / "a.npy", t / "hard.npy", t / "soft.npy"}) {
    const std::string why = refusal([&] { io::check_output(out, "--out", {t / "b.npy", t / "a.npy"}); });
    CHECK(why.find("same file as the input " + t / "a.npy") != std::string::npos);
  }
  CHECK(slurp(t / "a.npy") == "input");
  CHECK(io::check_output(t / "other.npy", "--out", {t / "a.npy"}) == t / "other.npy");
  CHECK(io::check_output(t / "soft.npy", "--out", {}) == fs::canonical(t / "a.npy").string());
}

TEST_CASE("check_output refuses /proc, /sys and missing or unwritable folders before any work", "[core][io]") {
  CHECK(refusal([] { io::check_output("/proc/self/comm", "--out"); }).find("/proc, /sys") != std::string::npos);
  CHECK(refusal([] { io::check_output("/proc/d.npy", "--out"); }).find("/proc, /sys") != std::string::npos);
  if (fs::is_directory("/sys/kernel"))
    CHECK(refusal([] { io::check_output("/sys/kernel/d.npy", "--out"); }).find("/proc, /sys") != std::string::npos);
  TempDir t;
  CHECK(refusal([&] { io::check_output(t / "no/d.npy", "--out"); }).find("does not exist") != std::string::npos);
  CHECK(t.entries() == 0);  // the probe file is gone
}
