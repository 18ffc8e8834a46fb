#include "scalemm/io/call_record.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scalemm/io/output_file.hpp"
#include "scalemm/status.hpp"

namespace scalemm::io {

std::string to_json(const CallRecord& r) {
  nlohmann::json j;
  j["m"] = r.m;
  j["n"] = r.n;
  j["k"] = r.k;
  j["alpha"] = r.alpha;
  for (auto [name, op] : {std::pair<const char*, const CallRecord::Operand*>{"a", &r.a}, {"b", &r.b}}) {
    j[name] = {{"recipe", std::string(to_string(op->recipe))},
               {"dtype", std::string(to_string(op->dtype))},
               {"scale_format", std::string(to_string(op->scale_format))},
               {"global_scale", op->global_scale}};
  }
  j["d_dtype"] = std::string(to_string(r.d_dtype));
  if (r.d_scale) j["d_scale"] = *r.d_scale;
  j["bias"] = r.bias;
  j["backend"] = r.backend;
  j["plan"] = r.plan;
  j["note"] = r.note;
  return j.dump(2) + '\n';
}

namespace {

// The error of a field that is missing or of the wrong JSON type: names the field, what it should be,
// what was there and the fix.
[[noreturn]] void field_error(const std::string& field, const std::string& expected, const std::string& actual) {
  throw Error(StatusCode::kIoError,
              field + ": expected " + expected + ", got " + actual +
                  ". Add the field (every call.json that SCALEMM_VERIFY=full writes has it) or dump the call "
                  "again [call-json-field]");
}

// `key` of the JSON object `obj`; `where` is the object's path ("" for the top level, "a." for operand a).
const nlohmann::json& field(const nlohmann::json& obj, const std::string& where, const char* key,
                            const std::string& expected) {
  if (!obj.is_object())
    field_error(where.empty() ? std::string("top level") : where.substr(0, where.size() - 1),
                "a JSON object", std::string("a JSON ") + obj.type_name());
  const auto it = obj.find(key);
  if (it == obj.end()) field_error(where + key, expected, "no such field (missing)");
  return *it;
}

std::string get_string(const nlohmann::json& obj, const std::string& where, const char* key,
                       const std::string& expected) {
  const auto& v = field(obj, where, key, expected);
  if (!v.is_string()) field_error(where + key, expected, std::string("a JSON ") + v.type_name() + " (" + v.dump() + ")");
  return v.get<std::string>();
}

// m, n, k: JSON integers only. get<int64_t>() of a JSON float out of int64 range (1e35) is undefined
// behaviour in the conversion, and 2.5 would be truncated silently.
int64_t get_dim(const nlohmann::json& j, const char* name) {
  const auto& v = field(j, "", name, "an integer in [1, 2^31]");
  if (!v.is_number_integer()) throw Error(StatusCode::kIoError, std::string(name) + " must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    throw Error(StatusCode::kIoError, std::string(name) + " is out of range");
  return v.get<int64_t>();
}

// alpha, global_scale, d_scale: JSON numbers that fit a finite float (1e39 would become inf, which
// to_json cannot write back).
float get_float(const nlohmann::json& v, const std::string& name) {
  if (!v.is_number()) throw Error(StatusCode::kIoError, name + " must be a number");
  const double d = v.get<double>();
  if (!(std::fabs(d) <= double(std::numeric_limits<float>::max())))
    throw Error(StatusCode::kIoError, name + " = " + v.dump() + " is outside the range of a float");
  return static_cast<float>(d);
}

}  // namespace

CallRecord parse_call_record(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kIoError, source + ": not valid JSON: " + e.what());
  }
  CallRecord r;
  try {
    r.m = get_dim(j, "m");
    r.n = get_dim(j, "n");
    r.k = get_dim(j, "k");
    r.alpha = get_float(field(j, "", "alpha", "a number (the GEMM's alpha)"), "alpha");
    for (auto [name, op] : {std::pair<const char*, CallRecord::Operand*>{"a", &r.a}, {"b", &r.b}}) {
      const std::string where = std::string(name) + ".";
      const auto& o = field(j, "", name, "an object with recipe, dtype and scale_format");
      op->recipe = parse_recipe_or_throw(get_string(o, where, "recipe", "a recipe name such as \"block1x128\""),
                                         where + "recipe");
      op->dtype = parse_dtype_or_throw(get_string(o, where, "dtype", "a dtype name such as \"e4m3\""), where + "dtype");
      op->scale_format = parse_scale_format_or_throw(
          get_string(o, where, "scale_format", "\"compact\" or \"cublaslt\""), where + "scale_format");
      op->global_scale = o.contains("global_scale") ? get_float(o.at("global_scale"), where + "global_scale") : 1.0f;
    }
    r.d_dtype = parse_dtype_or_throw(get_string(j, "", "d_dtype", "an output dtype name such as \"bf16\""), "d_dtype");
    if (j.contains("d_scale")) r.d_scale = get_float(j.at("d_scale"), "d_scale");
    r.bias = j.value("bias", false);
    r.backend = j.value("backend", "");
    r.plan = j.value("plan", "");
    r.note = j.value("note", "");
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kIoError, source + ": " + e.what());
  } catch (const Error& e) {
    throw Error(StatusCode::kIoError, source + ": " + e.status().message);
  }
  constexpr int64_t kMax = int64_t(1) << 31;
  if (r.m < 1 || r.n < 1 || r.k < 1 || r.m > kMax || r.n > kMax || r.k > kMax)
    throw Error(StatusCode::kIoError, source + ": m, n, k must be in [1, 2^31], got m=" + std::to_string(r.m) +
                                          " n=" + std::to_string(r.n) + " k=" + std::to_string(r.k));
  return r;
}

void write_call_record(const std::string& dir, const CallRecord& record) {
  const std::string text = to_json(record);
  write_output(dir + "/call.json", {text}, "call record");
}

CallRecord read_call_record(const std::string& dir) {
  const std::string path = dir + "/call.json";
  std::ifstream f(path);
  if (!f) throw Error(StatusCode::kIoError, path + ": cannot open");
  std::stringstream s;
  s << f.rdbuf();
  return parse_call_record(s.str(), path);
}

}  // namespace scalemm::io
