// call.json: the description of a dumped GEMM call (SCALEMM_VERIFY=full writes one beside the call's
// arrays as .npy files; `scalemm replay` reads it). One codec writes and reads it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "scalemm/types.hpp"

namespace scalemm::io {

struct CallRecord {
  struct Operand {
    Recipe recipe = Recipe::kTensorwise;
    DType dtype = DType::kE4M3;
    ScaleFormat scale_format = ScaleFormat::kCompact;
    float global_scale = 1.0f;
  };
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  Operand a, b;
  DType d_dtype = DType::kBF16;
  std::optional<float> d_scale;  ///< FP8 output: the D scale's value at the time of the dump
  bool bias = false;             ///< bias.npy is present
  std::string backend;           ///< the backend that ran ("native", ...)
  std::string plan;              ///< Plan::explain() of that run
  std::string note;              ///< why the call was dumped
};

/// The JSON text of a record.
std::string to_json(const CallRecord& record);

/// Parses call.json text; `source` names it in errors. Throws Error(kIoError) naming the field that is
/// missing, mistyped or out of range (m, n, k in [1, 2^31], known recipe/dtype/format names).
CallRecord parse_call_record(const std::string& text, const std::string& source);

/// Writes `dir`/call.json (atomically, as write_npy) / reads and parses it.
void write_call_record(const std::string& dir, const CallRecord& record);
CallRecord read_call_record(const std::string& dir);

}  // namespace scalemm::io
