#include "scalemm/io/npy.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <new>
#include <sstream>

#include "scalemm/io/output_file.hpp"
#include "scalemm/status.hpp"

namespace scalemm::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(StatusCode::kIoError, path + ": " + what);
}

int descr_size(const std::string& d) {
  if (d.size() < 3) return 0;
  const char kind = d[1];
  if (kind != 'f' && kind != 'u' && kind != 'i' && kind != 'b') return 0;
  // Digits only, 1 to 16 bytes: std::stoi alone would take "-4" or "4x" and a negative size would
  // turn the byte count negative.
  if (d.size() > 4 || d.find_first_not_of("0123456789", 2) != std::string::npos) return 0;
  const int n = std::stoi(d.substr(2));
  return n >= 1 && n <= 16 ? n : 0;
}

// Value of `key` in the header dict, as raw text up to the next top-level comma or brace.
std::string dict_value(const std::string& header, const std::string& key) {
  const auto k = header.find("'" + key + "'");
  if (k == std::string::npos) return {};
  auto p = header.find(':', k);
  if (p == std::string::npos) return {};
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  int depth = 0;
  size_t e = p;
  for (; e < header.size(); ++e) {
    char c = header[e];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) break;
  }
  if (e < header.size() && header[e] == ')') ++e;
  return header.substr(p, e - p);
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

int NpyArray::item_size() const { return descr_size(descr); }

std::string npy_type_name(const std::string& d) {
  if (d == "<f4") return "float32";
  if (d == "<f8") return "float64";
  if (d == "<f2") return "float16";
  if (d == "|u1" || d == "<u1") return "uint8";
  if (d == "<u2") return "uint16";
  if (d == "<i4") return "int32";
  if (d == "<i8") return "int64";
  if (d == "|b1") return "bool";
  return d;
}

std::string NpyArray::describe() const {
  std::ostringstream os;
  os << npy_type_name(descr) << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {

// The fixed part of a .npy file before the header text: magic, version, header length.
struct Preamble {
  size_t size = 0;       ///< bytes of magic + version + length field (10 or 12)
  uint32_t header = 0;   ///< bytes of header text that follow
};

// Reads the preamble from the first `n` bytes at `p` (n may be short: the file's size is checked).
Preamble parse_preamble(const unsigned char* p, size_t n, const std::string& path) {
  if (n < 8 || std::string(reinterpret_cast<const char*>(p), 6) != "\x93NUMPY") fail(path, "not a .npy file (bad magic)");
  const int major = p[6];
  Preamble pre;
  if (major == 1) {
    if (n < 10) fail(path, "truncated header");
    pre.size = 10;
    pre.header = p[8] | (p[9] << 8);
  } else if (major == 2 || major == 3) {
    if (n < 12) fail(path, "truncated header");
    pre.size = 12;
    pre.header = p[8] | (p[9] << 8) | (p[10] << 16) | (uint32_t(p[11]) << 24);
  } else {
    fail(path, "unsupported .npy version " + std::to_string(major));
  }
  return pre;
}

// Parses the header dict into descr and shape; returns the byte count of the data it declares.
// `available` is the number of bytes after the header.
int64_t parse_header(const std::string& header, int64_t available, const std::string& path, NpyArray& a) {
  std::string descr = dict_value(header, "descr");
  if (descr.size() < 2) fail(path, "header has no descr");
  a.descr = descr.substr(1, descr.size() - 2);
  if (a.descr.size() == 3 && a.descr[0] == '=') a.descr[0] = '<';
  if (!a.descr.empty() && a.descr[0] == '>' && descr_size(a.descr) > 1)
    fail(path, "big-endian data (" + a.descr + ") is not supported; save with dtype.newbyteorder('<')");
  if (descr_size(a.descr) == 0) fail(path, "unsupported dtype '" + a.descr + "'");
  if (dict_value(header, "fortran_order").rfind("True", 0) == 0)
    fail(path, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  std::string shape = dict_value(header, "shape");
  while (!shape.empty() && shape.back() == ' ') shape.pop_back();
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') fail(path, "header has no shape");
  // Strict: comma-separated non-negative integers (spaces around them allowed), an optional trailing
  // comma ("(5,)"), "()" for a scalar. std::stoll alone would read "1x8" as 1 and "-0" or " " as values.
  const std::string body = shape.substr(1, shape.size() - 2);
  const auto bad_shape = [&](size_t index, const std::string& item) {
    fail(path, "bad shape " + shape + ": dimension " + std::to_string(index) +
                   ": expected a non-negative integer (a shape is a tuple of integers such as (32, 128) or (5,)), "
                   "got '" + item + "'. Re-save the array with numpy.save [npy-shape]");
  };
  size_t at = 0, index = 0;
  while (at <= body.size()) {
    const size_t comma = std::min(body.find(',', at), body.size());
    std::string item = body.substr(at, comma - at);
    const size_t b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    item = b == std::string::npos ? std::string() : item.substr(b, e - b + 1);
    const bool last = comma == body.size();
    if (item.empty()) {
      // Allowed only for "()" and after a trailing comma ("(5,)"), never between two commas.
      if (last && (index > 0 || body.find_first_not_of(' ') == std::string::npos)) break;
      bad_shape(index, item);
    }
    if (item.find_first_not_of("0123456789") != std::string::npos) bad_shape(index, item);
    if (item.size() > 18) fail(path, "shape " + shape + " is too large");
    a.shape.push_back(std::stoll(item));
    ++index;
    at = comma + 1;
  }
  // Reject impossible shapes before allocating: negative extents, and sizes that overflow or exceed
  // what the file can hold.
  int64_t count = 1;
  for (int64_t e : a.shape) {
    if (e < 0) fail(path, "negative extent in shape " + shape);
    if (e != 0 && count > (int64_t(1) << 62) / e) fail(path, "shape " + shape + " is too large");
    count *= e;
  }
  if (count > (int64_t(1) << 62) / a.item_size()) fail(path, "shape " + shape + " is too large");
  const int64_t bytes = count * a.item_size();
  if (bytes > available)
    fail(path, "truncated data: the header declares " + std::to_string(bytes) + " bytes for " + a.describe() +
                   ", the file holds " + std::to_string(available));
  return bytes;
}

}  // namespace

NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& source) {
  const Preamble pre = parse_preamble(bytes, size, source);
  if (pre.header > size - pre.size) fail(source, "truncated header");
  const std::string header(reinterpret_cast<const char*>(bytes) + pre.size, pre.header);
  const size_t start = pre.size + pre.header;
  NpyArray a;
  const int64_t n = parse_header(header, static_cast<int64_t>(size - start), source, a);
  a.data.assign(bytes + start, bytes + start + n);
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open for reading");
  f.seekg(0, std::ios::end);
  const auto end = f.tellg();
  f.seekg(0);
  if (!f || end < 0) fail(path, "cannot read");
  const int64_t file_size = static_cast<int64_t>(end);
  unsigned char prefix[12] = {};
  const size_t got = static_cast<size_t>(std::min<int64_t>(file_size, 12));
  if (!f.read(reinterpret_cast<char*>(prefix), static_cast<std::streamsize>(got))) fail(path, "truncated header");
  const Preamble pre = parse_preamble(prefix, got, path);
  // The header length comes from the file: check it against the file's size before allocating.
  if (int64_t(pre.size) + int64_t(pre.header) > file_size) fail(path, "truncated header");
  f.seekg(static_cast<std::streamoff>(pre.size));
  std::string header(pre.header, '\0');
  if (!f.read(header.data(), pre.header)) fail(path, "truncated header");
  NpyArray a;
  const int64_t bytes = parse_header(header, file_size - int64_t(pre.size) - int64_t(pre.header), path, a);
  try {
    a.data.resize(static_cast<size_t>(bytes));
  } catch (const std::bad_alloc&) {
    fail(path, "the header declares " + std::to_string(bytes) + " bytes for " + a.describe() +
                   ", more than fits in memory");
  }
  if (bytes && !f.read(reinterpret_cast<char*>(a.data.data()), bytes))
    fail(path, "truncated data: expected " + std::to_string(bytes) + " bytes for " + a.describe());
  return a;
}

void write_npy(const std::string& path, const NpyArray& a, std::string_view option) {
  if (a.item_size() == 0) fail(path, "unsupported dtype '" + a.descr + "'");
  if (static_cast<int64_t>(a.data.size()) != a.numel() * a.item_size())
    fail(path, "data size " + std::to_string(a.data.size()) + " does not match " + a.describe());
  std::ostringstream h;
  h << "{'descr': '" << a.descr << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) h << a.shape[i] << (a.shape.size() == 1 || i + 1 < a.shape.size() ? "," : "");
  h << "), }";
  std::string header = h.str();
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xFF),
                                 static_cast<unsigned char>(header.size() >> 8)};
  write_output(path,
               {std::string_view(reinterpret_cast<const char*>(pre), 10), header,
                std::string_view(reinterpret_cast<const char*>(a.data.data()), a.data.size())},
               option);
}

}  // namespace scalemm::io
