#include "scalemm/io/npy.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

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
  try {
    return std::stoi(d.substr(2));
  } catch (...) {
    return 0;
  }
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

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open for reading");
  char magic[8];
  if (!f.read(magic, 8) || std::string(magic, 6) != "\x93NUMPY") fail(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) fail(path, "truncated header");
    hlen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) fail(path, "truncated header");
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  } else {
    fail(path, "unsupported .npy version " + std::to_string(major));
  }
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) fail(path, "truncated header");

  NpyArray a;
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
  if (shape.empty() || shape.front() != '(') fail(path, "header has no shape");
  std::stringstream ss(shape.substr(1, shape.size() - 2));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    try {
      a.shape.push_back(std::stoll(item));
    } catch (...) {
      fail(path, "bad shape " + shape);
    }
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
  {
    const auto here = f.tellg();
    f.seekg(0, std::ios::end);
    const int64_t available = static_cast<int64_t>(f.tellg() - here);
    f.seekg(here);
    if (bytes > available)
      fail(path, "truncated data: the header declares " + std::to_string(bytes) + " bytes for " + a.describe() +
                     ", the file holds " + std::to_string(available));
  }
  a.data.resize(static_cast<size_t>(bytes));
  if (bytes && !f.read(reinterpret_cast<char*>(a.data.data()), bytes))
    fail(path, "truncated data: expected " + std::to_string(bytes) + " bytes for " + a.describe());
  return a;
}

void write_npy(const std::string& path, const NpyArray& a) {
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
  const std::string tmp = path + ".tmp-scalemm";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail(path, "cannot open for writing");
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                   static_cast<unsigned char>(header.size() & 0xFF),
                                   static_cast<unsigned char>(header.size() >> 8)};
    f.write(reinterpret_cast<const char*>(pre), 10);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
    if (!f) {
      std::remove(tmp.c_str());
      fail(path, "write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, "cannot rename temporary file into place");
  }
}

}  // namespace scalemm::io
