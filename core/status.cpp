#include "scalemm/status.hpp"

#include <sstream>

namespace scalemm {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "SCALEMM_STATUS_OK";
    case StatusCode::kInvalidArgument: return "SCALEMM_STATUS_INVALID_ARGUMENT";
    case StatusCode::kInvalidLayout: return "SCALEMM_STATUS_INVALID_LAYOUT";
    case StatusCode::kUnsupported: return "SCALEMM_STATUS_UNSUPPORTED";
    case StatusCode::kCudaError: return "SCALEMM_STATUS_CUDA_ERROR";
    case StatusCode::kCublasError: return "SCALEMM_STATUS_CUBLAS_ERROR";
    case StatusCode::kOutOfMemory: return "SCALEMM_STATUS_OUT_OF_MEMORY";
    case StatusCode::kVerificationFailed: return "SCALEMM_STATUS_VERIFICATION_FAILED";
    case StatusCode::kIoError: return "SCALEMM_STATUS_IO_ERROR";
    case StatusCode::kInternal: return "SCALEMM_STATUS_INTERNAL";
  }
  return "SCALEMM_STATUS_UNKNOWN";
}

std::string Status::to_string() const {
  std::string s = status_code_name(code);
  if (!message.empty()) s += ": " + message;
  return s;
}

Error::Error(Status status) : std::runtime_error(status.to_string()), status_(std::move(status)) {}

std::string Diagnostic::to_string() const {
  std::ostringstream os;
  os << argument << ": " << message;
  if (!expected.empty() || !actual.empty()) os << ": expected " << expected << ", got " << actual;
  os << '.';
  if (!fix.empty()) os << ' ' << fix;
  if (!rule.empty()) os << " [" << rule << ']';
  return os.str();
}

std::string to_string(const Diagnostics& diags) {
  std::string out;
  for (const auto& d : diags) {
    if (!out.empty()) out += '\n';
    out += d.to_string();
  }
  return out;
}

void throw_if_any(const Diagnostics& diags, StatusCode code) {
  if (!diags.empty()) throw Error(code, to_string(diags));
}

namespace detail {
void throw_error(StatusCode code, const std::string& message, const char* file, int line) {
  std::ostringstream os;
  os << message << " (" << file << ':' << line << ')';
  throw Error(code, os.str());
}

void throw_api_error(StatusCode code, const std::string& what, const char* api_name, const char* description) {
  std::string msg = what + ": " + api_name;
  if (description && *description) msg += std::string(" (") + description + ")";
  if (code == StatusCode::kOutOfMemory) msg += "; out of device memory: free memory or use a smaller problem";
  throw Error(code, msg);
}
}  // namespace detail

}  // namespace scalemm
