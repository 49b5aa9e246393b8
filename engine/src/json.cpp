#include "strata/json.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace strata {
namespace {

struct Parser {
  const std::string& s;
  size_t i = 0;
  int max_depth;

  [[noreturn]] void fail(const std::string& what) const {
    std::ostringstream m;
    m << "invalid JSON: " << what << " at byte " << i;
    throw std::invalid_argument(m.str());
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool lit(const char* word) {
    size_t n = 0;
    while (word[n]) ++n;
    if (s.compare(i, n, word) == 0) { i += n; return true; }
    return false;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (i + 4 > s.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail("bad \\u escape");
    }
    return v;
  }
  std::string str() {
    if (i >= s.size() || s[i] != '"') fail("expected string");
    ++i;
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      char c = s[i++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') { out += c; continue; }
      if (i >= s.size()) fail("unterminated escape");
      char e = s[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i + 1 < s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            i += 2;
            uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else fail("bad surrogate pair");
          }
          put_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
    return out;
  }
  Json number() {
    size_t start = i;
    bool integral = true;
    if (s[i] == '-') ++i;
    if (i >= s.size() || !isdigit(static_cast<unsigned char>(s[i]))) fail("bad number");
    while (i < s.size() && isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i < s.size() && s[i] == '.') {
      integral = false; ++i;
      if (i >= s.size() || !isdigit(static_cast<unsigned char>(s[i]))) fail("bad number");
      while (i < s.size() && isdigit(static_cast<unsigned char>(s[i]))) ++i;
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      integral = false; ++i;
      if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
      if (i >= s.size() || !isdigit(static_cast<unsigned char>(s[i]))) fail("bad number");
      while (i < s.size() && isdigit(static_cast<unsigned char>(s[i]))) ++i;
    }
    std::string lit_text = s.substr(start, i - start);
    Json j;
    j.kind = Json::Kind::Number;
    j.number = std::strtod(lit_text.c_str(), nullptr);
    if (integral) {
      errno = 0;
      long long v = std::strtoll(lit_text.c_str(), nullptr, 10);
      if (errno == 0) { j.integral = true; j.integer = v; }
    }
    return j;
  }
  Json value(int depth) {
    if (depth > max_depth) fail("nesting too deep");
    ws();
    if (i >= s.size()) fail("unexpected end");
    char c = s[i];
    Json j;
    if (c == '{') {
      ++i;
      j.kind = Json::Kind::Object;
      ws();
      if (i < s.size() && s[i] == '}') { ++i; return j; }
      while (true) {
        ws();
        std::string key = str();
        ws();
        if (i >= s.size() || s[i] != ':') fail("expected ':'");
        ++i;
        j.object.emplace_back(std::move(key), value(depth + 1));
        ws();
        if (i < s.size() && s[i] == ',') { ++i; continue; }
        if (i < s.size() && s[i] == '}') { ++i; return j; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++i;
      j.kind = Json::Kind::Array;
      ws();
      if (i < s.size() && s[i] == ']') { ++i; return j; }
      while (true) {
        j.array.push_back(value(depth + 1));
        ws();
        if (i < s.size() && s[i] == ',') { ++i; continue; }
        if (i < s.size() && s[i] == ']') { ++i; return j; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') { j.kind = Json::Kind::String; j.string = str(); return j; }
    if (c == '-' || isdigit(static_cast<unsigned char>(c))) return number();
    if (lit("true")) { j.kind = Json::Kind::Bool; j.boolean = true; return j; }
    if (lit("false")) { j.kind = Json::Kind::Bool; return j; }
    if (lit("null")) return j;
    fail("unexpected character");
  }
};

}  // namespace

Json Json::parse(const std::string& text, int max_depth) {
  Parser p{text, 0, max_depth};
  Json j = p.value(0);
  p.ws();
  if (p.i != text.size()) p.fail("trailing characters");
  return j;
}

const Json* Json::find(const std::string& key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

}  // namespace strata
