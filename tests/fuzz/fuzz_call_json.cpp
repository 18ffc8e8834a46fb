// libFuzzer target: bytes -> io::parse_call_record (the call.json reader of `scalemm replay`).
// Property: either scalemm::Error(kIoError) is thrown, or the record has m, n, k in [1, 2^31]; then
// to_json of the record parses back to the same record.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scalemm/io/call_record.hpp"
#include "scalemm/status.hpp"

#include "fuzz_check.hpp"

namespace {
bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b); }
bool same_operand(const scalemm::io::CallRecord::Operand& a, const scalemm::io::CallRecord::Operand& b) {
  return a.recipe == b.recipe && a.dtype == b.dtype && a.scale_format == b.scale_format &&
         same_float(a.global_scale, b.global_scale);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using scalemm::io::CallRecord;
  const std::string text(reinterpret_cast<const char*>(data), size);
  CallRecord r;
  try {
    r = scalemm::io::parse_call_record(text, "call.json");
  } catch (const scalemm::Error& e) {
    FUZZ_CHECK(e.code() == scalemm::StatusCode::kIoError);
    return 0;
  }
  constexpr int64_t kMax = int64_t(1) << 31;
  FUZZ_CHECK(r.m >= 1 && r.m <= kMax && r.n >= 1 && r.n <= kMax && r.k >= 1 && r.k <= kMax);
  // The writer's output must read back as the same record.
  CallRecord back;
  try {
    back = scalemm::io::parse_call_record(scalemm::io::to_json(r), "round trip");
  } catch (const scalemm::Error& e) {
    std::fprintf(stderr, "fuzz_call_json: to_json output does not parse back: %s\n", e.what());
    std::abort();
  }
  FUZZ_CHECK(back.m == r.m && back.n == r.n && back.k == r.k && same_float(back.alpha, r.alpha));
  FUZZ_CHECK(same_operand(back.a, r.a) && same_operand(back.b, r.b) && back.d_dtype == r.d_dtype);
  FUZZ_CHECK(back.d_scale.has_value() == r.d_scale.has_value());
  if (r.d_scale) FUZZ_CHECK(same_float(*back.d_scale, *r.d_scale));
  FUZZ_CHECK(back.bias == r.bias && back.backend == r.backend && back.plan == r.plan && back.note == r.note);
  return 0;
}
