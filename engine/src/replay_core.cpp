// The replay's per-call core (see strata/replay_core.h). The reuse rule is strata/reuse_rule.h (the engine's
// too); every rule here mirrors strata_lab/replayer/state.py `SessionState`, and tests/test_replay_native.py
// steps both on the same calls. Compiled into strata_lab._replay, which links no OpenMP.
#include "strata/replay_core.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata {

namespace {

int64_t common_prefix(const int32_t* a, int64_t na, const int32_t* b, int64_t nb) {
  const int64_t n = std::min(na, nb);
  int64_t i = 0;
  while (i + 8 <= n && std::equal(a + i, a + i + 8, b + i)) i += 8;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

bool has_ckpt(const ReplaySession& s, int64_t pos) {
  for (const auto& c : s.ckpts)
    if (c.first == pos) return true;
  return false;
}

void add_segment(ReplaySession& s, int64_t start, int64_t end, int32_t kind, int64_t call) {
  if (end > start) s.segments.push_back({start, end, kind, call});
}

}  // namespace

ReplayCore::ReplayCore(ReplayRules rules) : rules_(std::move(rules)) {
  rules_.policy.validate();
  if (rules_.bytes_per_snapshot <= 0)
    throw std::invalid_argument("bytes_per_snapshot must be > 0, got " + std::to_string(rules_.bytes_per_snapshot));
  if (rules_.capacity == 0 || rules_.capacity < -1)
    throw std::invalid_argument("capacity must be -1 (no budget) or >= 1, got " + std::to_string(rules_.capacity));
}

ReplaySession& ReplayCore::get(int64_t code) {
  auto it = sessions_.find(code);
  if (it == sessions_.end()) throw std::out_of_range("no open replay session with code " + std::to_string(code));
  return *it->second;
}

const ReplaySession& ReplayCore::session(int64_t code) const {
  auto it = sessions_.find(code);
  if (it == sessions_.end()) throw std::out_of_range("no open replay session with code " + std::to_string(code));
  return *it->second;
}

void ReplayCore::open(int64_t code) {
  sessions_[code] = std::make_unique<ReplaySession>();
  peak_[code] = 0;
}

void ReplayCore::close(int64_t code) { sessions_.erase(code); }

int64_t ReplayCore::peak_bytes() const {
  int64_t t = 0;
  for (const auto& kv : peak_) t += kv.second;
  return t;
}

void ReplayCore::add_recorded_ms(double ms) {
  recorded_ms_ += ms;
  has_recorded_ = true;
}

int64_t ReplayCore::lcp_with(int64_t code, int64_t from, const int32_t* ids, int64_t n) const {
  const ReplaySession& s = session(code);
  const int64_t H = int64_t(s.held.size());
  if (from < 0 || from > H) return 0;
  return common_prefix(ids, n, s.held.data() + from, H - from);
}

ReplayPlan ReplayCore::plan(int64_t code, int64_t plen, int64_t lcp) const {
  const ReplaySession& s = session(code);
  const Reuse r = plan_reuse(
      plen, int64_t(s.held.size()), lcp, !rules_.hybrid, rules_.full_hit,
      [&](int64_t pos) { return has_ckpt(s, pos); },
      [&](int64_t pos) {
        int64_t best = 0;
        for (const auto& c : s.ckpts)
          if (c.first <= pos && c.first > best) best = c.first;
        return best;
      });
  ReplayPlan p;
  p.target = r.target;
  p.reused = r.reused;
  p.restored = r.restored;
  return p;
}

void ReplayCore::cut(ReplaySession& s, int64_t n, int64_t origins) {
  if (n < int64_t(s.held.size()))
    s.ckpts.erase(std::remove_if(s.ckpts.begin(), s.ckpts.end(), [n](const auto& c) { return c.first > n; }),
                  s.ckpts.end());
  n = origins;  // the held ids before it keep their origin (explain.SessionHistory: one divergence for every engine)
  if (n >= int64_t(s.held.size())) return;
  while (!s.segments.empty() && s.segments.back().start >= n) s.segments.pop_back();
  if (!s.segments.empty() && s.segments.back().end > n) s.segments.back().end = n;
}

void ReplayCore::touch(ReplaySession& s, int64_t pos) {
  for (auto& c : s.ckpts)
    if (c.first == pos) {
      c.second = ++tick_;
      return;
    }
  s.ckpts.emplace_back(pos, ++tick_);
}

// Snapshots taken while reading ids start..end: every `every`, at `positions`, at the prompt's end (prefill),
// and (prefill) before the last `before_last` id after start. Ascending, each evicting the least recently
// used one past the budget.
void ReplayCore::snapshot_span(ReplaySession& s, int64_t start, int64_t end, bool prompt_end) {
  std::vector<int64_t> ps;
  if (rules_.policy.every > 0)
    for (int64_t p = (start / rules_.policy.every + 1) * rules_.policy.every; p <= end; p += rules_.policy.every) ps.push_back(p);
  for (int64_t p : rules_.policy.positions)
    if (start < p && p <= end) ps.push_back(p);
  if (prompt_end && rules_.policy.at_prompt_end && end > 0) ps.push_back(end);
  if (prompt_end && rules_.policy.before_last >= 0) {
    // the last occurrence after `start` (an earlier one would not count: start < p is required)
    for (int64_t i = end - 1; i > start && i > 0; --i)
      if (s.held[size_t(i)] == rules_.policy.before_last) {
        ps.push_back(i);
        break;
      }
  }
  if (ps.empty()) return;
  std::sort(ps.begin(), ps.end());
  ps.erase(std::unique(ps.begin(), ps.end()), ps.end());
  for (int64_t p : ps) {
    touch(s, p);
    if (rules_.capacity > 0)
      while (int64_t(s.ckpts.size()) > rules_.capacity) {
        auto oldest = std::min_element(s.ckpts.begin(), s.ckpts.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
        s.ckpts.erase(oldest);
      }
  }
}

void ReplayCore::note_peak(int64_t code, const ReplaySession& s) {
  const int64_t b = int64_t(s.ckpts.size()) * rules_.bytes_per_snapshot;
  int64_t& p = peak_[code];
  if (b > p) p = b;
}

ReplayStep ReplayCore::advance(int64_t code, int64_t plen, int64_t lcp, const int32_t* tail, int64_t ntail,
                               const int32_t* gen, int64_t ngen, const int32_t* drained, int64_t ndrained,
                               const int32_t* ckpts, int64_t nckpts, int64_t part, int64_t row) {
  ReplaySession& s = get(code);
  const int64_t held_before = int64_t(s.held.size());
  if (lcp < 0 || lcp > held_before || lcp + ntail != plen)
    throw std::invalid_argument("advance: lcp " + std::to_string(lcp) + " + tail " + std::to_string(ntail) +
                                " must equal prompt_len " + std::to_string(plen) + " with lcp <= held (" +
                                std::to_string(held_before) + ")");
  const ReplayPlan p = plan(code, plen, lcp);
  // apply: restore (an LRU use), cut, read the prompt from the reuse point
  if (p.restored >= 0) touch(s, p.restored);
  cut(s, p.reused, lcp);
  s.held.resize(size_t(lcp));
  s.held.insert(s.held.end(), tail, tail + ntail);
  add_segment(s, lcp, plen, 0, s.calls);
  snapshot_span(s, p.reused, plen, true);
  s.calls += 1;
  // finish: the reply joins held
  const int64_t start = plen;
  s.held.insert(s.held.end(), gen, gen + ngen);
  add_segment(s, start, start + ngen, 1, s.calls - 1);
  s.held.insert(s.held.end(), drained, drained + ndrained);
  add_segment(s, start + ngen, start + ngen + ndrained, 2, s.calls - 1);
  snapshot_span(s, start, int64_t(s.held.size()), false);
  if (rules_.recorded_checkpoints) {
    s.ckpts.clear();
    const int64_t H = int64_t(s.held.size());
    for (int64_t k = 0; k < nckpts; ++k) {
      const int64_t c = ckpts[k];
      if (c > 0 && c <= H && !has_ckpt(s, c)) s.ckpts.emplace_back(c, ++tick_);
    }
  }
  s.last_part = part;
  s.last_row = row;
  s.last_plen = plen;
  note_peak(code, s);
  ReplayStep r;
  r.held_before = held_before;
  r.lcp = lcp;
  r.reused = p.reused;
  r.target = p.target;
  r.snapshots = int64_t(s.ckpts.size());
  r.index = s.calls - 1;
  r.restored = p.restored;
  return r;
}

int64_t ReplayCore::run(const ReplayBatch& b, int64_t start, const ReplayOut& out) {
  for (int64_t i = start; i < b.n; ++i) {
    if (b.slow[i] || b.prompt_len[i] < 0) return i;
    const int64_t code = b.code[i];
    auto it = sessions_.find(code);
    ReplaySession* s = it == sessions_.end() ? nullptr : it->second.get();
    const int64_t held_before = s ? int64_t(s->held.size()) : 0;
    const int64_t r = b.perm ? b.perm[i] : i;  // the row of the id lists
    const int32_t* suffix = b.suffix + b.suffix_off[r];
    const int64_t ns = b.suffix_off[r + 1] - b.suffix_off[r];
    int64_t plen, lcp, tail_from;
    if (b.parent[i] < 0) {  // a whole prompt
      plen = ns;
      lcp = s ? common_prefix(suffix, ns, s->held.data(), held_before) : 0;
      tail_from = lcp;
    } else {
      // the previous call's prompt shares `shared` ids; past it the session held its reply
      if (!s || s->last_part != b.part[i] || s->last_row != b.parent[i]) return i;
      const int64_t sh = b.shared[i], pprev = s->last_plen;
      if (sh < 0 || sh > pprev) return i;  // not a prefix of the previous prompt: Python reports the row
      plen = sh + ns;
      // a prompt that leaves the previous one parts from held there (the encoder's shared_len is the LCP)
      lcp = sh < pprev ? sh : pprev + common_prefix(suffix, ns, s->held.data() + pprev, held_before - pprev);
      tail_from = lcp - sh;
    }
    const bool miss = held_before > 0 && lcp < held_before;
    if (miss && !has_vocab()) return i;  // Python gives the vocabulary (or explains the miss itself)
    ReplayMiss m;
    if (miss) {
      const ReplayPlan p = plan(code, plen, lcp);
      m = explain(code, lcp, suffix + tail_from, ns - tail_from, p.reused, p.target);
      m.row = i;
    }
    if (!s) open(code);
    const int32_t* go = b.gen_off;
    const int32_t* dof = b.drained_off;
    const int32_t* co = b.ckpt_off;
    const int64_t ngen = go ? go[r + 1] - go[r] : 0, ndr = dof ? dof[r + 1] - dof[r] : 0;
    const int64_t nck = co ? co[r + 1] - co[r] : 0;
    const ReplayStep st = advance(code, plen, lcp, suffix + tail_from, ns - tail_from, go ? b.gen + go[r] : nullptr,
                                  ngen, dof ? b.drained + dof[r] : nullptr, ndr, co ? b.ckpt + co[r] : nullptr, nck,
                                  b.part[i], b.row[i]);
    // a hit: the prompt extends held (lcp_text = held_before), or the session held nothing (classify)
    const int64_t lcp_text = miss ? m.lcp_text : held_before;
    const ReplayCause cause = miss ? m.cause
                                   : held_before == 0 ? ReplayCause::new_session
                                   : st.reused >= st.target ? ReplayCause::none : ReplayCause::no_state_checkpoint;
    const ReplayAttribution a = attribute_call(rules_.hybrid, held_before, lcp, lcp_text, plen, st.reused, cause,
                                               miss ? m.tail : 0);
    out.prompt_len[i] = plen;
    out.held_before[i] = held_before;
    out.lcp[i] = lcp;
    out.reused[i] = st.reused;
    out.target[i] = st.target;
    out.reread[i] = a.reread;
    out.cause[i] = int8_t(a.cause);
    out.divergence[i] = is_divergence(a.divergence) ? int64_t(a.divergence) : -1;
    out.divergence_reread[i] = a.divergence_reread;
    out.engine_reread[i] = a.engine_reread;
    out.snapshots[i] = st.snapshots;
    out.index[i] = st.index;
    out.gen_len[i] = ngen;
    out.drained_len[i] = ndr;
    out.lcp_text[i] = lcp_text;
    out.restored[i] = st.restored;
    if (miss) misses_.push_back(std::move(m));
    const double t = b.prefill_ms[i];
    if (!std::isnan(t)) add_recorded_ms(t);
    if (b.last[i]) close(code);
  }
  return b.n;
}

ReplayVocab::ReplayVocab(std::string b, std::vector<int64_t> o, int64_t ims, int64_t asst)
    : blob(std::move(b)), off(std::move(o)), im_start(ims), assistant(asst) {
  if (off.empty() || off.front() != 0 || off.back() != int64_t(blob.size()))
    throw std::invalid_argument("vocab offsets must start at 0 and end at the blob's size");
  for (size_t i = 1; i < off.size(); ++i)
    if (off[i] < off[i - 1]) throw std::invalid_argument("vocab offsets must not decrease");
}

std::string_view ReplayVocab::token(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::invalid_argument("token id " + std::to_string(id) + " is out of range (0.." + std::to_string(size() - 1) +
                                ")");
  return std::string_view(blob).substr(size_t(off[size_t(id)]), size_t(off[size_t(id) + 1] - off[size_t(id)]));
}

ReplayMiss ReplayCore::explain(int64_t code, int64_t lcp, const int32_t* ptail, int64_t nptail, int64_t reused,
                               int64_t target) const {
  if (!has_vocab()) throw std::logic_error("explain: set_vocab first");
  const ReplaySession& s = session(code);
  const auto& held = s.held;
  const int64_t nh = int64_t(held.size()), plen = lcp + nptail;
  if (lcp < 0 || lcp >= nh) throw std::invalid_argument("explain: lcp must be < the held ids");
  ReplayMiss m;
  // the byte walk (divergence.find_divergence): held ids one at a time against the prompt's bytes
  int64_t hi = lcp, pi = 0;  // pi: ptail ids read
  std::string& pbuf = m.pbuf;
  while (hi < nh) {
    const std::string_view hb = token(held[size_t(hi)]);
    while (pbuf.size() < hb.size() && pi < nptail) pbuf.append(token(ptail[pi++]));
    if (pbuf.size() >= hb.size() && std::string_view(pbuf).substr(0, hb.size()) == hb) {
      pbuf.erase(0, hb.size());
      ++hi;
      continue;
    }
    const size_t mm = std::min(hb.size(), pbuf.size());
    size_t k = 0;
    while (k < mm && hb[k] == pbuf[k]) ++k;
    m.byte_in_token = int64_t(k);
    break;
  }
  m.lcp_text = hi;
  m.prompt_read = lcp + pi;
  // context windows (divergence.add_contexts): kCtx ids either side of each divergence
  constexpr int64_t kCtx = 24;
  auto held_bytes = [&](int64_t a, int64_t b) {
    std::string out;
    for (int64_t j = std::max<int64_t>(a, 0); j < std::min(b, nh); ++j) out.append(token(held[size_t(j)]));
    return out;
  };
  auto tail_bytes = [&](int64_t a, int64_t b) {
    std::string out;
    for (int64_t j = std::max<int64_t>(a, 0); j < std::min(b, nptail); ++j) out.append(token(ptail[j]));
    return out;
  };
  m.id_before = held_bytes(lcp - kCtx, lcp);
  m.id_held_after = held_bytes(lcp, lcp + kCtx);
  m.id_prompt_after = tail_bytes(0, kCtx);
  m.held_at.assign(held.begin() + lcp, held.begin() + std::min(lcp + 4, nh));
  m.prompt_at.assign(ptail, ptail + std::min<int64_t>(4, nptail));
  if (hi < nh) {
    const std::string_view hb = token(held[size_t(hi)]);
    const size_t k = size_t(m.byte_in_token);
    m.has_text = true;
    m.text_before = held_bytes(hi - kCtx, hi);
    m.text_before.append(hb.substr(0, k));
    m.text_held_after = std::string(hb.substr(k)) + held_bytes(hi + 1, hi + kCtx);
    m.text_prompt_after = (k < pbuf.size() ? pbuf.substr(k) : std::string()) + tail_bytes(pi, pi + kCtx);
  }
  // _realigned: held and prompt tokens share a boundary after lcp, no later than the text divergence
  if (hi > lcp) {
    if (hi >= nh) {
      m.retokenized = true;
    } else {
      std::vector<int64_t> ends;
      int64_t off = 0;
      for (int64_t j = lcp; j < hi; ++j) ends.push_back(off += int64_t(token(held[size_t(j)]).size()));
      const int64_t last = ends.back();
      size_t e = 0;
      int64_t poff = 0;
      for (int64_t j = 0; j < nptail; ++j) {
        poff += int64_t(token(ptail[j]).size());
        while (e < ends.size() && ends[e] < poff) ++e;
        if (e < ends.size() && ends[e] == poff) {
          m.retokenized = true;
          break;
        }
        if (poff > last) break;
      }
    }
  }
  // classify
  auto in_segment = [&](int64_t pos, bool gen, bool drained) {
    for (const auto& g : s.segments)
      if (g.start <= pos && pos < g.end && ((gen && g.kind == 1) || (drained && g.kind == 2))) return true;
    return false;
  };
  auto in_assistant_turn = [&](int64_t pos) {
    const int64_t im_start = vocab_->im_start, assistant = vocab_->assistant;
    if (im_start < 0) return false;
    for (int64_t j = std::min(pos, nh - 1); j >= 0; --j)
      if (held[size_t(j)] == im_start) return j + 1 < nh && assistant >= 0 && held[size_t(j) + 1] == assistant;
    return false;
  };
  if (lcp >= plen) {
    m.cause = reused >= target ? ReplayCause::none : ReplayCause::no_state_checkpoint;
  } else if (m.lcp_text > lcp && m.retokenized) {
    m.cause = in_segment(lcp, true, true) ? ReplayCause::retokenized_reply : ReplayCause::retokenized_prompt;
  } else if (in_segment(m.lcp_text, false, true)) {
    m.cause = ReplayCause::drained_dropped;
  } else if (in_segment(m.lcp_text, true, false) || in_assistant_turn(m.lcp_text)) {
    m.cause = ReplayCause::template_rewrite;
  } else {
    m.cause = ReplayCause::history_edit;
  }
  // the re-read past the text divergence (step.attribute_row): held ids past lcp_text the prompt repeats
  if (is_divergence(m.cause)) m.tail = realigned_tail(held.data() + m.lcp_text, nh - m.lcp_text, ptail, nptail);
  return m;
}

int64_t realigned_tail(const int32_t* h, int64_t nh, const int32_t* p, int64_t np) {
  constexpr int64_t G = 8;  // explain._GRAM
  if (nh < G || np < G) return 0;
  // every G consecutive ids hashed as explain._grams does (uint64, wrapping)
  auto grams = [](const int32_t* a, int64_t n) {
    std::vector<uint64_t> g(size_t(n - G + 1), 0);
    for (int64_t k = 0; k < G; ++k)
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] * 1099511628211ULL + uint64_t(int64_t(a[int64_t(i) + k]));
    return g;
  };
  const std::vector<uint64_t> gp = grams(p, np), gh = grams(h, nh);
  std::vector<std::pair<uint64_t, int64_t>> by;  // (gram, prompt position), sorted
  by.reserve(gp.size());
  for (size_t q = 0; q < gp.size(); ++q) by.emplace_back(gp[q], int64_t(q));
  std::sort(by.begin(), by.end());
  // the first prompt position >= j holding gram g, or -1
  auto first_from = [&](uint64_t g, int64_t j) -> int64_t {
    auto it = std::lower_bound(by.begin(), by.end(), std::make_pair(g, j));
    return it != by.end() && it->first == g ? it->second : -1;
  };
  std::vector<int64_t> cand;  // held positions whose gram the prompt has
  for (size_t i = 0; i < gh.size(); ++i) {
    auto it = std::lower_bound(by.begin(), by.end(), std::make_pair(gh[i], int64_t(0)));
    if (it != by.end() && it->first == gh[i]) cand.push_back(int64_t(i));
  }
  auto next_cand = [&](int64_t pos) { return size_t(std::lower_bound(cand.begin(), cand.end(), pos) - cand.begin()); };
  int64_t j = 0, matched = 0;
  size_t k = 0;
  while (k < cand.size()) {
    const int64_t i = cand[k];
    const int64_t q = first_from(gh[size_t(i)], j);
    if (q < 0 || !std::equal(h + i, h + i + G, p + q)) {  // the gram is not past j (or only its hash is)
      ++k;
      continue;
    }
    const int64_t m = G + common_prefix(h + i + G, nh - i - G, p + q + G, np - q - G);
    if (q - j > m && k + 1 < cand.size()) {
      // a run matched past more prompt ids than it holds must not swallow what the next held ids find before it
      const size_t k2 = next_cand(i + m);
      if (k2 < cand.size()) {
        const int64_t i2 = cand[k2], q2 = first_from(gh[size_t(i2)], j);
        if (q2 >= 0 && q2 < q && std::equal(h + i2, h + i2 + G, p + q2)) {
          ++k;
          continue;
        }
      }
    }
    matched += m;
    j = q + m;
    k = next_cand(i + m);
  }
  return matched;
}

ReplayAttribution attribute_call(bool hybrid, int64_t held, int64_t lcp, int64_t lcp_text, int64_t plen,
                                 int64_t reused, ReplayCause cause, int64_t tail) {
  ReplayAttribution a;
  const bool diverged = is_divergence(cause);
  a.divergence = diverged ? cause : held == 0 ? ReplayCause::new_session : ReplayCause::none;
  if (held == 0) {
    a.cause = reused ? ReplayCause::none : ReplayCause::new_session;
    return a;
  }
  const int64_t exact = std::min(lcp, std::max<int64_t>(plen - 1, 0));
  const int64_t short_ = std::max<int64_t>(std::min(exact, lcp) - reused, 0);
  // the engine's own reason (state.shortfall_cause): a hybrid restarts from an earlier snapshot
  ReplayCause ecause = ReplayCause::none;
  if (short_) {
    ecause = hybrid && reused < exact ? ReplayCause::no_state_checkpoint : ReplayCause::not_cached;
    if (ecause == ReplayCause::not_cached && reused == held - 1 && held - 1 == exact - 1)
      ecause = ReplayCause::last_output_token;
  }
  int64_t div_rr = diverged ? (lcp_text - lcp) + tail : 0, eng_rr = short_;
  if (diverged) {  // our engine's shortfall (a snapshot fallback, or none) is one the divergence makes
    div_rr += short_;
    eng_rr = 0;
  }
  const int64_t total = std::min(div_rr + eng_rr, std::max<int64_t>(plen - reused, 0));
  a.cause = diverged && div_rr >= eng_rr ? cause : eng_rr ? ecause : ReplayCause::none;
  a.reread = total;
  a.divergence_reread = std::min(div_rr, total);
  a.engine_reread = std::min(eng_rr, total - a.divergence_reread);
  return a;
}

}  // namespace strata
