// Byte-level BPE encoding of ASCII text for the Qwen2/3, Llama-3 and GPT-2 split regexes: the ids the
// `tokenizers` library gives for a stretch of text that holds no added token (strata_lab/traces/fast_encode.py
// cuts the text at the added tokens and normalizes; it uses this for the stretches this class takes).
//
// Pre-tokenisation follows the split regex alternative by alternative on the characters this class accepts
// (printable ASCII, tab, newline, carriage return: there ``\p{L}`` is [A-Za-z], ``\p{N}`` [0-9] and ``\s`` the
// four whitespace characters); each pre-token's ids come from a cache, else from the BPE merge loop (the
// lowest-ranked adjacent pair first, leftmost on ties: what the library's heap does) over the model's
// vocabulary and merges. `encode` returns false (and leaves `out` as it was) for text holding any other
// character, or a pre-token longer than kMaxPiece bytes: the caller encodes such a stretch another way.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

class ByteBpe {
 public:
  enum Split : int { kQwen = 0, kLlama3 = 1, kGpt2 = 2 };
  static constexpr size_t kMaxPiece = 512;     // longer pre-tokens: not taken (the merge loop is quadratic)
  static constexpr size_t kMaxCached = 1 << 18;  // pre-tokens remembered (then the cache starts over)
  // Stretches this long are remembered (a tool result a re-rendered turn holds again, a system prompt every
  // session starts with), up to kMaxKeptChars bytes of them; one that is not is cut after its first line break
  // followed by a printable character (a pre-token ends there in all three regexes) and the rest is looked up
  // and remembered on its own (the same text after another header); the whole stretch too, unless the part
  // before its rest is a short header (then a lookup finds the rest after it).
  static constexpr size_t kMinKept = 64;
  static constexpr size_t kMaxKeptChars = size_t(4) << 20;

  // `json`: a tokenizer.json document (its "model" object is read) or the BPE model's own JSON (an object with
  // "vocab" and "merges"). Throws std::invalid_argument when it is not byte-level BPE JSON this class reads.
  ByteBpe(const std::string& json, int split);

  // Appends the ids of `text` to `out`; false (out unchanged) when the text is not one this class takes.
  bool encode(const char* text, size_t n, std::vector<int32_t>& out);

  size_t vocab_size() const { return vocab_size_; }  // every token of the model's vocabulary
  size_t ascii_tokens() const { return ascii_.size(); }  // those whose bytes are ASCII (the ones used here)
  size_t merges() const { return merges_.size(); }
  size_t cached() const { return pretokens_.size() + short_.size(); }
  size_t kept() const { return stretches_.size(); }

 private:
  size_t next_piece(const unsigned char* s, size_t i, size_t n) const;
  bool bpe(const unsigned char* s, size_t n, std::vector<int32_t>& out) const;

  int split_;
  bool ignore_merges_ = false;
  size_t vocab_size_ = 0;
  int32_t byte_id_[128];
  std::unordered_map<std::string, int32_t> ascii_;     // ASCII token bytes -> id
  std::unordered_map<uint64_t, uint32_t> merges_;      // (left id << 32 | right id) -> rank
  // text -> its ids: open addressing (a power of two of slots, at most half used), keys in arena, ids in pool;
  // it starts over when it holds max_keys keys or max_chars characters of keys
  class Table {
   public:
    Table(size_t max_keys, size_t max_chars) : max_keys_(max_keys), max_chars_(max_chars) {}
    // appends the ids of s[0:n) to out if held (h: hash_bytes(s, n))
    bool get(const char* s, size_t n, uint64_t h, std::vector<int32_t>& out) const;
    void put(const char* s, size_t n, uint64_t h, const int32_t* ids, size_t count);
    size_t size() const { return used_; }

   private:
    struct Slot {
      uint64_t hash = 0;  // 0: empty
      uint32_t key = 0, key_len = 0, ids = 0, ids_len = 0;
    };
    size_t max_keys_, max_chars_;
    std::vector<Slot> slots_;
    size_t used_ = 0;
    std::string arena_;
    std::vector<int32_t> pool_;
  };
  // pre-tokens of at most 16 bytes with at most 4 ids (most words): key and ids held in the slot, compared as
  // two words (no key arena, no memcmp); it starts over when it holds kMaxCached keys
  class ShortTable {
   public:
    // the key of s[0:n) (n <= 16), zero-padded; `avail`: bytes readable from s (>= n)
    static void key(const char* s, size_t n, size_t avail, uint64_t& a, uint64_t& b);
    bool get(uint64_t a, uint64_t b, size_t n, std::vector<int32_t>& out) const;
    void put(uint64_t a, uint64_t b, size_t n, const int32_t* ids, size_t count);
    size_t size() const { return used_; }

   private:
    struct Slot {
      uint64_t a = 0, b = 0;
      uint32_t len = 0, count = 0;  // len 0: empty (a pre-token is never empty)
      int32_t ids[4] = {};
    };
    static size_t hash(uint64_t a, uint64_t b, size_t n);
    std::vector<Slot> slots_;
    size_t used_ = 0;
  };
  bool pieces(const char* text, size_t n, std::vector<int32_t>& out);  // pre-token by pre-token
  ShortTable short_;
  Table pretokens_{kMaxCached, size_t(1) << 30};
  Table stretches_{size_t(1) << 20, kMaxKeptChars};  // stretches of >= kMinKept bytes
};

}  // namespace strata
