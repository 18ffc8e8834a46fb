// Byte-for-byte comparison of scalemm's codecs with a reference (ml_dtypes, exact math, CUDA), with
// every accepted difference named: a rule says what scalemm must produce instead of the reference
// and why. docs/numerics.md ("Where implementations disagree") names the same rules.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace scalemm_test_tally {

/// What scalemm must produce for one input: the reference's value (rule == nullptr), or a value
/// fixed by a named, documented rule.
struct Expected {
  uint32_t value;
  const char* rule;
};

inline Expected reference(uint32_t v) { return {v, nullptr}; }
inline Expected by_rule(uint32_t v, const char* rule) { return {v, rule}; }

inline bool is_nan_f32(uint32_t x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }

class Tally {
 public:
  Tally(std::string what, std::string reference_name, int out_hex_digits)
      : what_(std::move(what)), reference_name_(std::move(reference_name)), digits_(out_hex_digits) {}

  void add(uint32_t input, uint32_t got, uint32_t ref, Expected e) {
    ++total_;
    if (e.rule != nullptr) {
      auto& r = rules_[e.rule];
      ++r.applied;
      if (ref != e.value) ++r.differs;
    }
    if (got != e.value) {
      ++mismatches_;
      if (examples_.size() < kMaxExamples) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "  input 0x%08X: scalemm 0x%0*X, %s 0x%0*X, expected 0x%0*X%s%s", input,
                      digits_, got, reference_name_.c_str(), digits_, ref, digits_, e.value,
                      e.rule ? " by rule: " : "", e.rule ? e.rule : "");
        examples_.emplace_back(buf);
      }
    }
  }

  uint64_t mismatches() const { return mismatches_; }
  uint64_t total() const { return total_; }

  /// Inputs where the reference differs from scalemm by a named rule.
  uint64_t documented_differences() const {
    uint64_t n = 0;
    for (const auto& r : rules_) n += r.second.differs;
    return n;
  }

  std::string report() const {
    std::string s = what_ + " vs " + reference_name_ + ": " + std::to_string(total_) + " inputs, " +
                    std::to_string(mismatches_) + " mismatches";
    for (const auto& r : rules_)
      s += "\n  named difference (" + std::to_string(r.second.differs) + " of " + std::to_string(r.second.applied) +
           " inputs it covers differ from " + reference_name_ + "): " + r.first;
    if (!examples_.empty()) {
      s += "\n  first mismatches:";
      for (const auto& e : examples_) s += "\n" + e;
    }
    return s;
  }

  void print() const { std::printf("%s\n", report().c_str()); }

 private:
  static constexpr size_t kMaxExamples = 16;
  struct RuleCount {
    uint64_t applied = 0;
    uint64_t differs = 0;
  };
  std::string what_, reference_name_;
  int digits_;
  uint64_t total_ = 0, mismatches_ = 0;
  std::map<std::string, RuleCount> rules_;
  std::vector<std::string> examples_;
};

}  // namespace scalemm_test_tally
