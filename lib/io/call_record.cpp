#include "scalemm/io/call_record.hpp"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

CallRecord parse_call_record(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kIoError, source + ": not valid JSON: " + e.what());
  }
  CallRecord r;
  try {
    r.m = j.at("m").get<int64_t>();
    r.n = j.at("n").get<int64_t>();
    r.k = j.at("k").get<int64_t>();
    r.alpha = j.at("alpha").get<float>();
    for (auto [name, op] : {std::pair<const char*, CallRecord::Operand*>{"a", &r.a}, {"b", &r.b}}) {
      const auto& o = j.at(name);
      op->recipe = parse_recipe_or_throw(o.at("recipe").get<std::string>(), std::string(name) + ".recipe");
      op->dtype = parse_dtype_or_throw(o.at("dtype").get<std::string>(), std::string(name) + ".dtype");
      op->scale_format =
          parse_scale_format_or_throw(o.at("scale_format").get<std::string>(), std::string(name) + ".scale_format");
      op->global_scale = o.value("global_scale", 1.0f);
    }
    r.d_dtype = parse_dtype_or_throw(j.at("d_dtype").get<std::string>(), "d_dtype");
    if (j.contains("d_scale")) r.d_scale = j.at("d_scale").get<float>();
    r.bias = j.value("bias", false);
    r.backend = j.value("backend", "");
    r.plan = j.value("plan", "");
    r.note = j.value("note", "");
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kIoError, source + ": " + e.what());
  } catch (const Error& e) {
    throw Error(StatusCode::kIoError, source + ": " + e.what());
  }
  constexpr int64_t kMax = int64_t(1) << 31;
  if (r.m < 1 || r.n < 1 || r.k < 1 || r.m > kMax || r.n > kMax || r.k > kMax)
    throw Error(StatusCode::kIoError, source + ": m, n, k must be in [1, 2^31], got m=" + std::to_string(r.m) +
                                          " n=" + std::to_string(r.n) + " k=" + std::to_string(r.k));
  return r;
}

void write_call_record(const std::string& dir, const CallRecord& record) {
  const std::string path = dir + "/call.json", tmp = path + ".tmp-scalemm";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << to_json(record);
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(StatusCode::kIoError, path + ": cannot write");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(StatusCode::kIoError, path + ": cannot rename temporary file into place");
  }
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
