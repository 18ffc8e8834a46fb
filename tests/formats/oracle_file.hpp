// Reader for the file that tests/formats/oracle.py writes (layout documented there).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace scalemm_test_oracle {

struct Section {
  uint32_t elem_size = 0;
  uint64_t count = 0;
  std::vector<uint8_t> data;
};

class OracleFile {
 public:
  /// Reads the file named by $SCALEMM_FORMATS_ORACLE; throws with a message saying how to get one.
  static const OracleFile& from_environment() {
    static const OracleFile file = load_from_environment();
    return file;
  }

  uint64_t seed() const { return seed_; }
  const std::string& path() const { return path_; }

  template <class T>
  const T* get(const std::string& name, uint64_t expected_count) const {
    auto it = sections_.find(name);
    if (it == sections_.end()) throw std::runtime_error("oracle file " + path_ + " has no section '" + name + "'");
    const Section& s = it->second;
    if (s.elem_size != sizeof(T) || s.count != expected_count)
      throw std::runtime_error("oracle section '" + name + "' has " + std::to_string(s.count) + " elements of " +
                               std::to_string(s.elem_size) + " bytes, expected " +
                               std::to_string(expected_count) + " of " + std::to_string(sizeof(T)));
    return reinterpret_cast<const T*>(s.data.data());
  }

  uint64_t count(const std::string& name) const {
    auto it = sections_.find(name);
    if (it == sections_.end()) throw std::runtime_error("oracle file " + path_ + " has no section '" + name + "'");
    return it->second.count;
  }

 private:
  static OracleFile load_from_environment() {
    const char* path = std::getenv("SCALEMM_FORMATS_ORACLE");
    if (path == nullptr || *path == '\0')
      throw std::runtime_error(
          "SCALEMM_FORMATS_ORACLE is not set. Run this test through ctest (fixture 'formats_oracle' runs "
          "tests/formats/oracle.py first), or run `python3 tests/formats/oracle.py --out FILE` and set "
          "SCALEMM_FORMATS_ORACLE=FILE.");
    OracleFile f;
    f.path_ = path;
    std::FILE* in = std::fopen(path, "rb");
    if (in == nullptr) throw std::runtime_error(std::string("cannot open oracle file ") + path);
    auto read = [&](void* dst, size_t n) {
      if (std::fread(dst, 1, n, in) != n) {
        std::fclose(in);
        throw std::runtime_error(std::string("oracle file ") + path + " is truncated");
      }
    };
    char magic[8];
    read(magic, 8);
    if (std::memcmp(magic, "SMMORCL1", 8) != 0) {
      std::fclose(in);
      throw std::runtime_error(std::string(path) + " is not a scalemm formats oracle file");
    }
    uint32_t nsections = 0;
    read(&f.seed_, 8);
    read(&nsections, 4);
    for (uint32_t i = 0; i < nsections; ++i) {
      char name[33] = {};
      Section s;
      read(name, 32);
      read(&s.elem_size, 4);
      read(&s.count, 8);
      s.data.resize(size_t(s.elem_size) * size_t(s.count));
      read(s.data.data(), s.data.size());
      f.sections_[name] = std::move(s);
    }
    std::fclose(in);
    return f;
  }

  std::string path_;
  uint64_t seed_ = 0;
  std::map<std::string, Section> sections_;
};

}  // namespace scalemm_test_oracle
