// Byte-level BPE of ASCII text (strata/byte_bpe.h): the model's vocabulary and merges read from its JSON,
// the split regex followed alternative by alternative, the merge loop for pre-tokens not seen yet.
#include "strata/byte_bpe.h"

#include "strata/json.h"

#include <cstring>
#include <stdexcept>

namespace strata {

namespace {

enum : unsigned char { X = 0, L = 1, N = 2, W = 3, P = 4 };  // refused, letter, digit, whitespace, other

struct Classes {
  unsigned char c[256];
  Classes() {
    std::memset(c, X, sizeof c);
    for (int b = 0x21; b < 0x7f; ++b) c[b] = P;
    for (int b = 'A'; b <= 'Z'; ++b) c[b] = L;
    for (int b = 'a'; b <= 'z'; ++b) c[b] = L;
    for (int b = '0'; b <= '9'; ++b) c[b] = N;
    c[static_cast<unsigned char>(' ')] = c[static_cast<unsigned char>('\t')] = W;
    c[static_cast<unsigned char>('\n')] = c[static_cast<unsigned char>('\r')] = W;
  }
};
const Classes kClass;

inline unsigned char cls(unsigned char b) { return kClass.c[b]; }
inline unsigned char lower(unsigned char b) { return (b >= 'A' && b <= 'Z') ? b + 32 : b; }
inline size_t run(const unsigned char* s, size_t i, size_t n, unsigned char k) {
  while (i < n && cls(s[i]) == k) ++i;
  return i;
}

// A byte-level token's text -> its bytes, when they are all ASCII (GPT-2's bytes_to_unicode, inverted: bytes
// 0x21-0x7e stand for themselves, 0x00-0x20 for U+0100-U+0120, 0x7f for U+0121).
bool ascii_bytes(const std::string& text, std::string& out) {
  out.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0, n = text.size();
  while (i < n) {
    unsigned char b = s[i];
    if (b >= 0x21 && b < 0x7f) {
      out += static_cast<char>(b);
      ++i;
    } else if ((b == 0xC4 || b == 0xC5) && i + 1 < n) {  // U+0100-U+017F
      uint32_t cp = ((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
      if (cp <= 0x120) out += static_cast<char>(cp - 0x100);
      else if (cp == 0x121) out += static_cast<char>(0x7f);
      else return false;
      i += 2;
    } else {
      return false;
    }
  }
  return !out.empty();
}

}  // namespace

ByteBpe::ByteBpe(const std::string& json, int split) : split_(split) {
  if (split < kQwen || split > kGpt2) throw std::invalid_argument("ByteBpe: unknown split regex");
  auto fail = [](const std::string& what) { throw std::invalid_argument("tokenizer JSON: " + what); };
  Json doc;
  try {
    doc = Json::parse(json);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  const Json* model = doc.is_object() ? doc.find("model") : nullptr;
  if (model == nullptr) model = &doc;  // the BPE model's own JSON
  if (!model->is_object()) fail("the model is not an object");
  if (const Json* type = model->find("type"); type != nullptr && type->is_string() && type->string != "BPE")
    fail("not a BPE model");
  if (const Json* im = model->find("ignore_merges"); im != nullptr && !im->is_null()) {
    if (im->kind != Json::Kind::Bool) fail("ignore_merges: expected a boolean");
    ignore_merges_ = im->boolean;
  }
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* affix = model->find(name);
    if (affix == nullptr || affix->is_null()) continue;
    if (!affix->is_string()) fail(std::string(name) + ": expected a string or null");
    if (!affix->string.empty()) fail("a subword prefix / suffix is not byte-level BPE");
  }
  const Json* vocab = model->find("vocab");
  const Json* merges = model->find("merges");
  if (vocab == nullptr || !vocab->is_object() || merges == nullptr || !merges->is_array())
    fail("no BPE vocab and merges");
  std::string bytes_a, bytes_b;
  ascii_.reserve(1 << 18);
  merges_.reserve(1 << 19);
  for (const auto& [text, id] : vocab->object) {
    if (!id.is_number() || !id.integral) fail("vocab: expected an integer id for a token");
    ++vocab_size_;
    if (ascii_bytes(text, bytes_a)) ascii_[bytes_a] = static_cast<int32_t>(id.integer);
  }
  // a merge of two ASCII tokens (the others never apply to ASCII text); the merged token is looked up when
  // the merge applies (bpe)
  uint32_t rank = 0;
  std::string left, right;
  for (const Json& m : merges->array) {
    if (m.is_array() && m.array.size() == 2 && m.array[0].is_string() && m.array[1].is_string()) {  // ["a", "b"]
      left = m.array[0].string;
      right = m.array[1].string;
    } else if (m.is_string()) {  // "a b"
      size_t sp = m.string.find(' ');
      if (sp == std::string::npos) fail("a merge without a space");
      left = m.string.substr(0, sp);
      right = m.string.substr(sp + 1);
    } else {
      fail("a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const uint32_t r = rank++;
    if (!ascii_bytes(left, bytes_a) || !ascii_bytes(right, bytes_b)) continue;
    auto l = ascii_.find(bytes_a);
    if (l == ascii_.end()) continue;
    auto rt = ascii_.find(bytes_b);
    if (rt == ascii_.end()) continue;
    uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) | static_cast<uint32_t>(rt->second);
    merges_.emplace(k, r);
  }
  for (int c = 0; c < 128; ++c) {
    auto it = ascii_.find(std::string(1, static_cast<char>(c)));
    byte_id_[c] = it == ascii_.end() ? -1 : it->second;
  }
}

size_t ByteBpe::next_piece(const unsigned char* s, size_t i, size_t n) const {
  const unsigned char c = s[i];
  const unsigned char k = cls(c);
  if (split_ == kGpt2) {
    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    if (c == '\'' && i + 1 < n) {
      unsigned char d = s[i + 1];
      if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
      if (i + 2 < n && ((d == 'r' && s[i + 2] == 'e') || (d == 'v' && s[i + 2] == 'e') || (d == 'l' && s[i + 2] == 'l')))
        return i + 3;
    }
    size_t j = i;
    if (c == ' ' && i + 1 < n && cls(s[i + 1]) != W) j = i + 1;
    unsigned char kj = cls(s[j]);
    if (kj != W) return run(s, j, n, kj);
  } else {
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1 or 1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
    // |\s*[\r\n]+|\s+(?!\S)|\s+
    if (c == '\'' && i + 1 < n) {
      unsigned char d = lower(s[i + 1]);
      if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
      if (i + 2 < n) {
        unsigned char f = lower(s[i + 2]);
        if (((d == 'r' || d == 'v') && f == 'e') || (d == 'l' && f == 'l')) return i + 3;
      }
    }
    if (k == L) return run(s, i, n, L);
    if (k != N && c != '\r' && c != '\n' && i + 1 < n && cls(s[i + 1]) == L) return run(s, i + 1, n, L);
    if (k == N) {
      if (split_ == kQwen) return i + 1;
      size_t j = i + 1;
      while (j < n && j < i + 3 && cls(s[j]) == N) ++j;
      return j;
    }
    size_t j = (c == ' ' && i + 1 < n && cls(s[i + 1]) == P) ? i + 1 : i;
    if (cls(s[j]) == P) {
      j = run(s, j, n, P);
      while (j < n && (s[j] == '\r' || s[j] == '\n')) ++j;
      return j;
    }
    // whitespace from here: \s*[\r\n]+ (through the run's last line break)
    size_t w = run(s, i, n, W);
    for (size_t q = w; q > i; --q)
      if (s[q - 1] == '\n' || s[q - 1] == '\r') return q;
    if (w == n) return w;  // \s+(?!\S) at the end
    return w - 1 > i ? w - 1 : w;  // \s+(?!\S) leaves the last space to the next token, else \s+
  }
  // GPT-2's whitespace
  size_t w = run(s, i, n, W);
  if (w == n) return w;
  return w - 1 > i ? w - 1 : w;
}

bool ByteBpe::bpe(const unsigned char* s, size_t n, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = ascii_.find(std::string(reinterpret_cast<const char*>(s), n));
    if (it != ascii_.end()) {
      out.push_back(it->second);
      return true;
    }
  }
  std::vector<int32_t> sym(n);
  std::vector<uint32_t> len(n, 1);  // bytes per symbol
  for (size_t i = 0; i < n; ++i) {
    int32_t id = byte_id_[s[i]];
    if (id < 0) return false;
    sym[i] = id;
  }
  std::string joined;
  while (sym.size() > 1) {
    uint32_t best = UINT32_MAX;
    size_t pos = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) | static_cast<uint32_t>(sym[i + 1]);
      auto it = merges_.find(k);
      if (it != merges_.end() && it->second < best) {  // the lowest rank; the leftmost of equal pairs
        best = it->second;
        pos = i;
      }
    }
    if (best == UINT32_MAX) break;
    size_t at = 0;
    for (size_t i = 0; i < pos; ++i) at += len[i];
    joined.assign(reinterpret_cast<const char*>(s) + at, len[pos] + len[pos + 1]);
    auto j = ascii_.find(joined);
    if (j == ascii_.end()) return false;  // a merge into no token: the library refuses such a model
    sym[pos] = j->second;
    len[pos] += len[pos + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(pos) + 1);
    len.erase(len.begin() + static_cast<std::ptrdiff_t>(pos) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
  return true;
}

namespace {

inline uint64_t hash_bytes(const char* s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, s, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    s += 8;
    n -= 8;
  }
  if (n) {
    uint64_t v = 0;
    std::memcpy(&v, s, n);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h | 1;  // never 0 (an empty slot)
}

}  // namespace

bool ByteBpe::Table::get(const char* s, size_t n, uint64_t h, std::vector<int32_t>& out) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& sl = slots_[i];
    if (sl.hash == 0) return false;
    if (sl.hash == h && sl.key_len == n && std::memcmp(arena_.data() + sl.key, s, n) == 0) {
      const int32_t* ids = pool_.data() + sl.ids;
      if (sl.ids_len == 1) out.push_back(*ids);
      else out.insert(out.end(), ids, ids + sl.ids_len);
      return true;
    }
  }
}

void ByteBpe::Table::put(const char* s, size_t n, uint64_t h, const int32_t* ids, size_t count) {
  if (used_ >= max_keys_ || arena_.size() + n > max_chars_ || pool_.size() + count > UINT32_MAX / 2) {
    slots_.assign(slots_.size(), Slot{});  // start over
    used_ = 0;
    arena_.clear();
    pool_.clear();
  }
  if (slots_.empty() || (used_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old(slots_.empty() ? 1024 : slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Slot& sl : old) {
      if (sl.hash == 0) continue;
      size_t i = sl.hash & mask;
      while (slots_[i].hash != 0) i = (i + 1) & mask;
      slots_[i] = sl;
    }
  }
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  Slot& sl = slots_[i];
  sl.hash = h;
  sl.key = static_cast<uint32_t>(arena_.size());
  sl.key_len = static_cast<uint32_t>(n);
  sl.ids = static_cast<uint32_t>(pool_.size());
  sl.ids_len = static_cast<uint32_t>(count);
  arena_.append(s, n);
  pool_.insert(pool_.end(), ids, ids + count);
  ++used_;
}

void ByteBpe::ShortTable::key(const char* s, size_t n, size_t avail, uint64_t& a, uint64_t& b) {
  unsigned char buf[16] = {};
  if (avail >= 16) {
    std::memcpy(buf, s, 16);
    std::memset(buf + n, 0, 16 - n);
  } else {
    std::memcpy(buf, s, n);
  }
  std::memcpy(&a, buf, 8);
  std::memcpy(&b, buf + 8, 8);
}

size_t ByteBpe::ShortTable::hash(uint64_t a, uint64_t b, size_t n) {
  uint64_t h = (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ (n * 0x165667B19E3779F9ull);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return static_cast<size_t>(h ^ (h >> 32));
}

bool ByteBpe::ShortTable::get(uint64_t a, uint64_t b, size_t n, std::vector<int32_t>& out) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash(a, b, n) & mask;; i = (i + 1) & mask) {
    const Slot& sl = slots_[i];
    if (sl.len == 0) return false;
    if (sl.a == a && sl.b == b && sl.len == n) {
      if (sl.count == 1) out.push_back(sl.ids[0]);
      else out.insert(out.end(), sl.ids, sl.ids + sl.count);
      return true;
    }
  }
}

void ByteBpe::ShortTable::put(uint64_t a, uint64_t b, size_t n, const int32_t* ids, size_t count) {
  if (used_ >= kMaxCached) {  // start over
    slots_.assign(slots_.size(), Slot{});
    used_ = 0;
  }
  if (slots_.empty() || (used_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old(slots_.empty() ? 1024 : slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Slot& sl : old) {
      if (sl.len == 0) continue;
      size_t i = hash(sl.a, sl.b, sl.len) & mask;
      while (slots_[i].len != 0) i = (i + 1) & mask;
      slots_[i] = sl;
    }
  }
  const size_t mask = slots_.size() - 1;
  size_t i = hash(a, b, n) & mask;
  while (slots_[i].len != 0) i = (i + 1) & mask;
  Slot& sl = slots_[i];
  sl.a = a;
  sl.b = b;
  sl.len = static_cast<uint32_t>(n);
  sl.count = static_cast<uint32_t>(count);
  std::memcpy(sl.ids, ids, count * sizeof(int32_t));
  ++used_;
}

bool ByteBpe::pieces(const char* text, size_t n, std::vector<int32_t>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text);
  size_t i = 0;
  while (i < n) {
    const size_t j = next_piece(s, i, n);
    const size_t len = j - i;
    if (len <= 16) {
      uint64_t a, b;
      ShortTable::key(text + i, len, n - i, a, b);
      if (!short_.get(a, b, len, out)) {  // (a short pre-token of more than 4 ids: in pretokens_)
        const uint64_t h = hash_bytes(text + i, len);
        if (!pretokens_.get(text + i, len, h, out)) {
          const size_t before = out.size();
          if (!bpe(s + i, len, out)) return false;
          const size_t count = out.size() - before;
          if (count <= 4) short_.put(a, b, len, out.data() + before, count);
          else pretokens_.put(text + i, len, h, out.data() + before, count);
        }
      }
      i = j;
      continue;
    }
    if (len > kMaxPiece) return false;
    const uint64_t h = hash_bytes(text + i, len);
    if (!pretokens_.get(text + i, len, h, out)) {
      const size_t before = out.size();
      if (!bpe(s + i, len, out)) return false;
      pretokens_.put(text + i, len, h, out.data() + before, out.size() - before);
    }
    i = j;
  }
  return true;
}

bool ByteBpe::encode(const char* text, size_t n, std::vector<int32_t>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text);
  // printable ASCII, tab, newline, carriage return only (branch-free, so the compiler vectorizes it)
  unsigned bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char b = s[i];
    bad |= static_cast<unsigned>(static_cast<unsigned char>(b - 0x20) > 0x5e) &
           static_cast<unsigned>(b != '\t') & static_cast<unsigned>(b != '\n') & static_cast<unsigned>(b != '\r');
  }
  if (bad) return false;
  const size_t start = out.size();
  bool ok = true;
  if (n < kMinKept) {
    ok = pieces(text, n, out);
  } else {
    const uint64_t h = hash_bytes(text, n);
    if (stretches_.get(text, n, h, out)) return true;
    size_t p = 0;  // after the first line break followed by a printable character
    for (size_t i = 0; i + 1 < n; ++i)
      if (s[i] == '\n' && s[i + 1] > 0x20 && s[i + 1] < 0x7f) {
        p = i + 1;
        break;
      }
    if (p) {
      ok = pieces(text, p, out);
      const size_t rest = n - p;
      if (ok) {
        const uint64_t hr = rest >= kMinKept ? hash_bytes(text + p, rest) : 0;
        if (!(rest >= kMinKept && stretches_.get(text + p, rest, hr, out))) {
          const size_t before = out.size();
          ok = pieces(text + p, rest, out);
          if (ok && rest >= kMinKept) stretches_.put(text + p, rest, hr, out.data() + before, out.size() - before);
        }
      }
    } else {
      ok = pieces(text, n, out);
    }
    // whole, unless its rest is remembered and the part before it short (a header: "user\n"); the lookup
    // then finds the rest after encoding that part
    if (ok && (p == 0 || p > kMinKept || n - p < kMinKept))
      stretches_.put(text, n, h, out.data() + start, out.size() - start);
  }
  if (!ok) out.resize(start);
  return ok;
}

}  // namespace strata
