// The .npy and call.json readers on malformed input (cases found while writing tests/fuzz/ and by
// its targets; each names what it guards against).
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "scalemm/io/call_record.hpp"
#include "scalemm/io/npy.hpp"
#include "scalemm/status.hpp"

using namespace scalemm;

namespace {

// A version 1.0 .npy file with the given header dict text and data bytes.
std::vector<uint8_t> npy_bytes(const std::string& dict, const std::vector<uint8_t>& data, int major = 1) {
  std::string header = dict;
  const size_t pre = major == 1 ? 10 : 12;
  header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  const size_t n = header.size();
  out.push_back(uint8_t(n & 0xFF));
  out.push_back(uint8_t(n >> 8));
  if (major != 1) {
    out.push_back(uint8_t(n >> 16));
    out.push_back(uint8_t(n >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

StatusCode parse_code(const std::vector<uint8_t>& bytes) {
  try {
    io::parse_npy(bytes.data(), bytes.size(), "t.npy");
  } catch (const Error& e) {
    return e.code();
  }
  return StatusCode::kOk;
}

}  // namespace

TEST_CASE("parse_npy reads what write_npy writes and read_npy agrees with it", "[core][io]") {
  io::NpyArray a;
  a.descr = "<f4";
  a.shape = {2, 3};
  a.data.resize(24);
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = uint8_t(i);
  const std::string path = "test_io_roundtrip.npy";
  io::write_npy(path, a);
  std::ifstream f(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const io::NpyArray b = io::parse_npy(bytes.data(), bytes.size(), path);
  const io::NpyArray c = io::read_npy(path);
  std::remove(path.c_str());
  CHECK(b.descr == "<f4");
  CHECK(b.shape == a.shape);
  CHECK(b.data == a.data);
  CHECK(c.data == a.data);
}

TEST_CASE("a .npy dtype size must be a plain positive byte count", "[core][io]") {
  // std::stoi took "-4" (a negative item size, then a negative byte count) and "4x".
  for (const char* descr : {"<f-4", "<f4x", "<u+1", "<i 4", "<f0", "<f99"}) {
    CAPTURE(descr);
    const auto bytes = npy_bytes(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }",
                                 std::vector<uint8_t>(64, 0));
    CHECK(parse_code(bytes) == StatusCode::kIoError);
  }
  const auto ok = npy_bytes("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", {1, 0, 2, 0});
  CHECK(parse_code(ok) == StatusCode::kOk);
}

TEST_CASE("a .npy header length larger than the file is refused before allocating", "[core][io]") {
  // Version 2.0 carries a 32-bit header length: a 12-byte file declaring a 4 GB header made
  // read_npy allocate 4 GB before noticing that the file ends.
  const std::vector<uint8_t> bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xF0, 0xFF, 0xFF, 0xFF};
  CHECK(parse_code(bytes) == StatusCode::kIoError);
  const std::string path = "test_io_huge_header.npy";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  try {
    io::read_npy(path);
    FAIL("read_npy accepted a truncated header");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kIoError);
    CHECK(std::string(e.what()).find("truncated header") != std::string::npos);
  }
  std::remove(path.c_str());
}

TEST_CASE("truncated .npy prefixes and data are I/O errors", "[core][io]") {
  const auto good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::vector<uint8_t>(12, 0));
  for (size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    const std::vector<uint8_t> cut(good.begin(), good.begin() + long(n));
    CHECK(parse_code(cut) == StatusCode::kIoError);
  }
  CHECK(parse_code(good) == StatusCode::kOk);
}

namespace {
std::string call_json(const std::string& m, const std::string& alpha = "1.0", const std::string& extra = "") {
  return "{\"m\": " + m + ", \"n\": 32, \"k\": 64, \"alpha\": " + alpha +
         ", \"a\": {\"recipe\": \"tensorwise\", \"dtype\": \"e4m3\", \"scale_format\": \"compact\"}"
         ", \"b\": {\"recipe\": \"tensorwise\", \"dtype\": \"e4m3\", \"scale_format\": \"compact\"}"
         ", \"d_dtype\": \"bf16\"" + extra + "}";
}
StatusCode call_code(const std::string& text) {
  try {
    io::parse_call_record(text, "call.json");
  } catch (const Error& e) {
    return e.code();
  }
  return StatusCode::kOk;
}
}  // namespace

// Found by tests/fuzz/fuzz_call_json: "m": 1.3e35 reached get<int64_t>() of a double out of range
// (undefined behaviour, UBSan float-cast-overflow); a float field of 1e39 became inf, which to_json
// writes as null, so a dumped call could not be read back.
TEST_CASE("call.json dims must be JSON integers and floats must fit a float", "[core][io]") {
  CHECK(call_code(call_json("16")) == StatusCode::kOk);
  for (const char* m : {"1.33e35", "-1e300", "2.5", "16.0", "18446744073709551615", "\"16\"", "null"}) {
    CAPTURE(m);
    CHECK(call_code(call_json(m)) == StatusCode::kIoError);
  }
  for (const char* alpha : {"1e39", "-1e300", "\"1\"", "null"}) {
    CAPTURE(alpha);
    CHECK(call_code(call_json("16", alpha)) == StatusCode::kIoError);
  }
  CHECK(call_code(call_json("16", "1.0", ", \"d_scale\": 1e40")) == StatusCode::kIoError);
  CHECK(call_code(call_json("16", "3.4e38", ", \"d_scale\": 0.5")) == StatusCode::kOk);
  const io::CallRecord r = io::parse_call_record(call_json("16", "-2"), "call.json");
  CHECK(io::parse_call_record(io::to_json(r), "again").alpha == -2.0f);
}

namespace {
std::string parse_message(const std::vector<uint8_t>& bytes) {
  try {
    io::parse_npy(bytes.data(), bytes.size(), "t.npy");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// The shape used to go through std::stoll item by item: "(32, 1x8)" was read as (32, 1) and "(3,,4)"
// as (3, 4).
TEST_CASE("a .npy shape must be a tuple of non-negative integers", "[core][io]") {
  const auto with_shape = [](const std::string& shape, size_t bytes) {
    return npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': " + shape + ", }",
                     std::vector<uint8_t>(bytes, 0));
  };
  for (const char* shape : {"(32, 1x8)", "(3,,4)", "(,)", "(,3)", "(1.5,)", "(-0, 2)", "(+3,)", "(3 4,)", "(0x10,)",
                            "(3, 4,,)", "(a)"}) {
    CAPTURE(shape);
    const std::string msg = parse_message(with_shape(shape, 4096));
    CHECK(msg.find("SCALEMM_STATUS_IO_ERROR") != std::string::npos);
    CHECK(msg.find("t.npy: bad shape") != std::string::npos);
    CHECK(msg.find("expected a non-negative integer") != std::string::npos);
    CHECK(msg.find("[npy-shape]") != std::string::npos);
  }
  const std::string msg = parse_message(with_shape("(32, 1x8)", 4096));
  CHECK(msg.find("dimension 1") != std::string::npos);
  CHECK(msg.find("got '1x8'") != std::string::npos);
  CHECK(msg.find("numpy.save") != std::string::npos);
  // What numpy writes is still read: (), (5,), (3, 4), spaces and a trailing comma.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> good = {
      {"()", {}}, {"( )", {}}, {"(5,)", {5}}, {"(3, 4)", {3, 4}}, {"(3, 4,)", {3, 4}}, {"( 3 ,4 , )", {3, 4}},
      {"(0, 7)", {0, 7}}};
  for (const auto& [shape, dims] : good) {
    CAPTURE(shape);
    const auto bytes = with_shape(shape, 64);
    const io::NpyArray a = io::parse_npy(bytes.data(), bytes.size(), "t.npy");
    CHECK(a.shape == dims);
  }
  CHECK(parse_message(with_shape("(9999999999999999999, 1)", 16)).find("too large") != std::string::npos);
}

namespace {
std::string call_message(const std::string& text) {
  try {
    io::parse_call_record(text, "call.json");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kIoError);
    return e.what();
  }
  return "";
}
}  // namespace

// A missing field used to be reported in the JSON library's words ("[json.exception.out_of_range.403]
// key 'k' not found").
TEST_CASE("call.json: a missing or mistyped field is named with what it should be", "[core][io]") {
  const std::string full = call_json("16");
  const auto without = [&](const std::string& piece) {
    std::string t = full;
    const auto at = t.find(piece);
    REQUIRE(at != std::string::npos);
    return t.erase(at, piece.size());
  };
  struct Row {
    std::string text, needle;
  };
  const std::vector<Row> rows = {
      {without(", \"k\": 64"), "k: expected an integer in [1, 2^31], got no such field (missing)"},
      {without(", \"alpha\": 1.0"), "alpha: expected a number"},
      {without(", \"d_dtype\": \"bf16\""), "d_dtype: expected an output dtype name"},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(rows[i].text);
    const std::string msg = call_message(rows[i].text);
    CHECK(msg.find("call.json: " + rows[i].needle) != std::string::npos);
    CHECK(msg.find("[call-json-field]") != std::string::npos);
    CHECK(msg.find("json.exception") == std::string::npos);
  }
  std::string no_fmt = full;
  no_fmt.replace(no_fmt.find(", \"scale_format\": \"compact\""), std::string(", \"scale_format\": \"compact\"").size(), "");
  std::string msg = call_message(no_fmt);
  CHECK(msg.find("call.json: a.scale_format: expected \"compact\" or \"cublaslt\", got no such field") !=
        std::string::npos);
  std::string typed = full;
  typed.replace(typed.find("\"tensorwise\""), std::string("\"tensorwise\"").size(), "5");
  msg = call_message(typed);
  CHECK(msg.find("a.recipe: expected a recipe name such as \"block1x128\", got a JSON number (5)") != std::string::npos);
  std::string b_array = full;
  b_array.replace(b_array.find("\"b\": {"), 6, "\"b\": [{");
  b_array.insert(b_array.find("}, \"d_dtype\"") + 1, "]");
  msg = call_message(b_array);
  CHECK(msg.find("call.json: b: expected a JSON object, got a JSON array") != std::string::npos);
  msg = call_message("[1, 2]");
  CHECK(msg.find("call.json: top level: expected a JSON object, got a JSON array") != std::string::npos);
}

TEST_CASE("a .npy that declares more data than fits in memory is named, not a bare bad_alloc", "[core][io]") {
  // A sparse file of 16 GiB whose header declares all of it, read under an address-space limit a
  // little above what the process maps now: the allocation fails whatever the machine's memory.
  const std::string path = "/tmp/scalemm-test-huge-" + std::to_string(::getpid()) + ".npy";
  const std::vector<uint8_t> head = npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (17179869184,), }", {});
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(head.data()), std::streamsize(head.size()));
  }
  if (::truncate(path.c_str(), off_t(head.size()) + (off_t(1) << 34)) != 0) {
    std::remove(path.c_str());
    WARN("SKIPPED: this filesystem cannot hold a sparse 16 GiB file");
    return;
  }
  long vm_kb = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stol(line.substr(7));
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_AS, &old) == 0);
  rlimit cap = old;
  cap.rlim_cur = rlim_t(vm_kb) * 1024 + (rlim_t(1) << 31);
  REQUIRE(::setrlimit(RLIMIT_AS, &cap) == 0);
  std::string message;
  try {
    io::read_npy(path);
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_AS, &old);
  std::remove(path.c_str());
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("declares 17179869184 bytes") != std::string::npos);
  CHECK(message.find("more than fits in memory") != std::string::npos);
}
