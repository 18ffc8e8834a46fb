// libFuzzer target: bytes -> io::parse_npy (the parser behind io::read_npy).
// Property: either scalemm::Error(kIoError) is thrown, or the array is consistent: a supported dtype,
// no negative extent, and data.size() == numel() * item_size(); writing it back and parsing the
// written file gives the same array.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include "scalemm/io/npy.hpp"
#include "scalemm/status.hpp"

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scalemm::io::NpyArray a;
  try {
    a = scalemm::io::parse_npy(data, size, "fuzz.npy");
  } catch (const scalemm::Error& e) {
    FUZZ_CHECK(e.code() == scalemm::StatusCode::kIoError);
    return 0;
  }
  FUZZ_CHECK(a.item_size() > 0);
  for (int64_t e : a.shape) FUZZ_CHECK(e >= 0);
  FUZZ_CHECK(static_cast<int64_t>(a.data.size()) == a.numel() * a.item_size());
  // Round trip through write_npy (a temporary file: the writer itself is under test too).
  static const std::string tmp = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/fuzz_npy_" + std::to_string(::getpid()) + ".npy";
  }();
  scalemm::io::write_npy(tmp, a);
  const scalemm::io::NpyArray b = scalemm::io::read_npy(tmp);
  std::remove(tmp.c_str());
  FUZZ_CHECK(b.descr == a.descr && b.shape == a.shape && b.data == a.data);
  return 0;
}
