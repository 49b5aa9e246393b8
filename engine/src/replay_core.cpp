// The replay's per-call core (see strata/replay_core.h). Every rule here mirrors
// strata_lab/replayer/state.py `SessionState`; tests/test_replay_core.py steps both on the same calls.
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
  if (rules_.full_hit < 0 || rules_.full_hit > 3)
    throw std::invalid_argument("full_hit must be 0..3, got " + std::to_string(rules_.full_hit));
  if (rules_.every < 0) throw std::invalid_argument("every must be >= 0, got " + std::to_string(rules_.every));
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
  const int64_t held_before = int64_t(s.held.size());
  ReplayPlan p;
  // reuse_target: the LCP, less the last prompt id when the engine must compute its logits
  const int fh = rules_.full_hit;
  if (lcp < plen || fh == 3)
    p.target = lcp;
  else if ((fh == 0 || fh == 1) && plen == held_before)
    p.target = lcp;
  else if (fh == 0 && plen > 0 && has_ckpt(s, plen))
    p.target = lcp;
  else
    p.target = std::max<int64_t>(plen - 1, 0);
  // reuse_from_target: a hybrid state off its end needs a snapshot at or before the target
  if (!rules_.hybrid || p.target == held_before) {
    p.reused = p.target;
  } else {
    int64_t best = 0;
    for (const auto& c : s.ckpts)
      if (c.first <= p.target && c.first > best) best = c.first;
    p.reused = best;
  }
  if (p.reused != held_before && has_ckpt(s, p.reused) && (rules_.hybrid || p.reused == plen)) p.restored = p.reused;
  return p;
}

void ReplayCore::cut(ReplaySession& s, int64_t n) {
  if (n >= int64_t(s.held.size())) return;
  s.ckpts.erase(std::remove_if(s.ckpts.begin(), s.ckpts.end(), [n](const auto& c) { return c.first > n; }),
                s.ckpts.end());
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
  if (rules_.every > 0)
    for (int64_t p = (start / rules_.every + 1) * rules_.every; p <= end; p += rules_.every) ps.push_back(p);
  for (int64_t p : rules_.positions)
    if (start < p && p <= end) ps.push_back(p);
  if (prompt_end && rules_.at_prompt_end && end > 0) ps.push_back(end);
  if (prompt_end && rules_.before_last >= 0) {
    // the last occurrence after `start` (an earlier one would not count: start < p is required)
    for (int64_t i = end - 1; i > start && i > 0; --i)
      if (s.held[size_t(i)] == rules_.before_last) {
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
  cut(s, p.reused);
  s.held.resize(size_t(lcp));
  s.held.insert(s.held.end(), tail, tail + ntail);
  add_segment(s, p.reused, plen, 0, s.calls);
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
  return r;
}

int64_t ReplayCore::run(const ReplayBatch& b, int64_t start, const ReplayOut& out) {
  for (int64_t i = start; i < b.n; ++i) {
    if (b.slow[i] || b.prompt_len[i] < 0) return i;
    const int64_t code = b.code[i];
    auto it = sessions_.find(code);
    ReplaySession* s = it == sessions_.end() ? nullptr : it->second.get();
    const int64_t held_before = s ? int64_t(s->held.size()) : 0;
    const int32_t* suffix = b.suffix + b.suffix_off[i];
    const int64_t ns = b.suffix_off[i + 1] - b.suffix_off[i];
    int64_t plen, lcp, tail_from;
    if (b.parent[i] < 0) {  // a whole prompt
      plen = ns;
      lcp = s ? common_prefix(suffix, ns, s->held.data(), held_before) : 0;
      tail_from = lcp;
    } else {
      // the previous call's prompt shares `shared` ids; past it the session held its reply
      if (!s || s->last_part != b.part[i] || s->last_row != b.parent[i]) return i;
      const int64_t sh = b.shared[i], pprev = s->last_plen;
      if (sh != pprev) return i;  // the prompt leaves the previous one: a miss (or a malformed row)
      plen = sh + ns;
      lcp = pprev + common_prefix(suffix, ns, s->held.data() + pprev, held_before - pprev);
      tail_from = lcp - sh;
    }
    if (held_before > 0 && lcp < held_before) return i;  // a miss: Python explains it
    if (!s) open(code);
    const int32_t* go = b.gen_off;
    const int32_t* dof = b.drained_off;
    const int32_t* co = b.ckpt_off;
    const int64_t ngen = go ? go[i + 1] - go[i] : 0, ndr = dof ? dof[i + 1] - dof[i] : 0;
    const int64_t nck = co ? co[i + 1] - co[i] : 0;
    const ReplayStep r = advance(code, plen, lcp, suffix + tail_from, ns - tail_from, go ? b.gen + go[i] : nullptr,
                                 ngen, dof ? b.drained + dof[i] : nullptr, ndr, co ? b.ckpt + co[i] : nullptr, nck,
                                 b.part[i], b.row[i]);
    // a hit: the prompt extends held (lcp_text = held_before), or the session held nothing
    const int64_t useful = std::min(held_before, held_before >= plen ? r.target : held_before);
    out.prompt_len[i] = plen;
    out.held_before[i] = held_before;
    out.lcp[i] = lcp;
    out.reused[i] = r.reused;
    out.target[i] = r.target;
    out.reread[i] = std::max<int64_t>(useful - r.reused, 0);
    out.snapshots[i] = r.snapshots;
    out.index[i] = r.index;
    out.gen_len[i] = ngen;
    out.drained_len[i] = ndr;
    out.cause[i] = held_before == 0 ? 1 : (r.reused >= r.target ? 0 : 2);
    const double t = b.prefill_ms[i];
    if (!std::isnan(t)) add_recorded_ms(t);
    if (b.last[i]) close(code);
  }
  return b.n;
}

}  // namespace strata
