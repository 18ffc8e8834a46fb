// Status codes, the exception the C++ API throws, and validation diagnostics.
//
// Two ways of saying "no":
//  * validation answers with a list of Diagnostic values, because "this buffer is wrong" is a normal
//    answer for the CLI and the planner;
//  * everything else throws scalemm::Error carrying a Status (the C ABI turns it into a code).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace scalemm {

/// Stable numeric codes; the C ABI returns exactly these values (see scalemm.h).
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,    ///< an argument is malformed (null pointer, negative size, unknown name)
  kInvalidLayout = 2,      ///< a scale or data buffer breaks its layout contract
  kUnsupported = 3,        ///< valid, but no backend can run it under the requested policy
  kCudaError = 4,          ///< a CUDA runtime call failed
  kCublasError = 5,        ///< a cuBLASLt call failed
  kOutOfMemory = 6,        ///< an allocation failed
  kVerificationFailed = 7, ///< a result disagreed with the reference beyond tolerance
  kIoError = 8,            ///< a file could not be read or written
  kInternal = 9,           ///< a broken invariant inside scalemm (a bug: please report)
};
inline constexpr int kStatusCodeCount = 10;

/// "SCALEMM_STATUS_INVALID_LAYOUT" for kInvalidLayout; "SCALEMM_STATUS_UNKNOWN" for other values.
const char* status_code_name(StatusCode code) noexcept;

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const noexcept { return code == StatusCode::kOk; }
  /// "SCALEMM_STATUS_INVALID_LAYOUT: scale_b: ..."
  std::string to_string() const;
};

/// The one exception type of the C++ API.
class Error : public std::runtime_error {
 public:
  explicit Error(Status status);
  Error(StatusCode code, const std::string& message) : Error(Status{code, message}) {}
  const Status& status() const noexcept { return status_; }
  StatusCode code() const noexcept { return status_.code; }

 private:
  Status status_;
};

/// One broken rule, named so that a user can act on it without reading the source.
/// Printed as: "<argument>: <message>: expected <expected>, got <actual>. <fix> [<rule>]".
struct Diagnostic {
  std::string argument;  ///< which argument: "scale_b", "a", "k", ...
  std::string rule;      ///< stable identifier of the rule, e.g. "blk128-kblock-stride"
  std::string message;   ///< what the rule demands, in words
  std::string expected;  ///< the value the rule wants
  std::string actual;    ///< the value that was given
  std::string fix;       ///< what to do about it (may be empty)

  std::string to_string() const;
};
using Diagnostics = std::vector<Diagnostic>;

/// Joins diagnostics one per line (empty string for none).
std::string to_string(const Diagnostics& diags);

/// Throws Error(code, joined diagnostics) when diags is not empty.
void throw_if_any(const Diagnostics& diags, StatusCode code = StatusCode::kInvalidLayout);

namespace detail {
[[noreturn]] void throw_error(StatusCode code, const std::string& message, const char* file, int line);

/// The library's one form for a failed CUDA or cuBLASLt call: throws Error(code, "<what>: <api_name>
/// (<description>)"). Callers pass kOutOfMemory for allocation failures, so that out-of-memory is
/// reported as such whichever call ran out (see detail/cuda_check.hpp).
[[noreturn]] void throw_api_error(StatusCode code, const std::string& what, const char* api_name,
                                  const char* description);
}  // namespace detail

}  // namespace scalemm

/// Precondition check that throws scalemm::Error with the call site.
#define SCALEMM_EXPECTS(cond, code, msg)                                                  \
  do {                                                                                    \
    if (!(cond)) ::scalemm::detail::throw_error((code), (msg), __FILE__, __LINE__);       \
  } while (0)
