// A small strict JSON reader for config.json and safetensors headers (no dependency, bounded depth).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata {

class Json {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  bool integral = false;  // the literal had no fraction or exponent
  int64_t integer = 0;    // exact value when integral and it fits
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;  // document order kept

  // Parses a whole document; throws std::invalid_argument("... at byte N") on any error.
  static Json parse(const std::string& text, int max_depth = 64);

  bool is_null() const { return kind == Kind::Null; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_number() const { return kind == Kind::Number; }
  bool is_string() const { return kind == Kind::String; }
  // Object member or nullptr.
  const Json* find(const std::string& key) const;
};

}  // namespace strata
