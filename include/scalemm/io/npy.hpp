// Reading and writing NumPy .npy files (format versions 1.0-3.0, little-endian, C order).
//
// scalemm's file convention: FP8/FP4/E8M0/UE4M3 arrays are stored as uint8 raw bits (FP4 packed two per
// byte, element 2i in the low nibble); fp32 as float32; bf16 as uint16 raw bits; fp16 as float16.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace scalemm::io {

struct NpyArray {
  std::string descr;           ///< NumPy type string: "<f4", "|u1", "<f2", "<u2", "<f8", "<i4", ...
  std::vector<int64_t> shape;  ///< C order
  std::vector<uint8_t> data;   ///< raw little-endian bytes

  int64_t numel() const;
  int item_size() const;
  /// "float32[128, 4]"
  std::string describe() const;

  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data.data()); }
};

/// Reads a .npy file; throws scalemm::Error(kIoError) naming the path and what is wrong (not a .npy,
/// Fortran order, big-endian, truncated data, unsupported dtype).
NpyArray read_npy(const std::string& path);

/// Parses the bytes of a whole .npy file held in memory (`source` names it in errors); the same
/// checks and errors as read_npy.
NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& source);

/// Writes a .npy file (version 1.0) through io::write_output (output_file.hpp): atomically, through a
/// symlink, never over a device, FIFO or socket. `option` names the path in errors. Throws Error(kIoError).
void write_npy(const std::string& path, const NpyArray& array, std::string_view option = "output");

/// NumPy's name for a descr ("<f4" -> "float32").
std::string npy_type_name(const std::string& descr);

}  // namespace scalemm::io
