#include "socllm/attention_scheme.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <tuple>

#include "socllm/core.h"
#include "socllm/kernels.h"

namespace socllm::quant {

namespace {

using json = nlohmann::json;

constexpr std::array<const char*, 5> kKindNames = {"fp32", "sparse", "block-sparse", "npu-int8",
                                                   "shadow-attn"};

std::string kind_list() {
  std::string s;
  for (const char* n : kKindNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// The options each kind takes (besides "kind").
std::vector<std::string> kind_options(AttentionKind k) {
  switch (k) {
    case AttentionKind::Fp32:
    case AttentionKind::NpuInt8: return {};
    case AttentionKind::Sparse: return {"keep", "min_keys", "ratios", "clamp_quantile"};
    case AttentionKind::BlockSparse:
      return {"keep", "min_keys", "ratios", "clamp_quantile", "block"};
    case AttentionKind::ShadowAttn:
      return {"keep",    "min_keys", "ratios", "clamp_quantile",
              "buckets", "step",     "scales", "certified"};
  }
  return {};
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

std::string num(double v) {
  std::array<char, 32> buf{};
  const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

// A text option value: integer, decimal, or the text itself.
json text_value(const std::string& v) {
  const char *b = v.data(), *e = v.data() + v.size();
  int64_t i = 0;
  if (auto r = std::from_chars(b, e, i); r.ptr == e && r.ec == std::errc() && !v.empty()) return i;
  double d = 0;
  if (auto r = std::from_chars(b, e, d); r.ptr == e && r.ec == std::errc() && !v.empty()) return d;
  return v;
}

}  // namespace

const char* attention_kind_name(AttentionKind k) { return kKindNames.at(static_cast<size_t>(k)); }

bool is_attention_kind(const std::string& s) {
  return std::find_if(kKindNames.begin(), kKindNames.end(),
                      [&](const char* n) { return s == n; }) != kKindNames.end();
}

AttentionKind attention_kind_from_name(const std::string& s) {
  for (size_t i = 0; i < kKindNames.size(); ++i)
    if (s == kKindNames[i]) return static_cast<AttentionKind>(i);
  throw InvalidArgument("[AttentionScheme] unknown attention '" + s + "' (known: " + kind_list() +
                        ")");
}

const std::vector<std::string>& AttentionScheme::option_names() {
  static const std::vector<std::string> kNames = {"keep",           "min_keys", "ratios",
                                                  "clamp_quantile", "block",    "buckets",
                                                  "step",           "scales",   "certified"};
  return kNames;
}

void AttentionScheme::validate() const {
  const std::string k = std::string("[AttentionScheme] ") + attention_kind_name(kind) + ": ";
  if (!(keep > 0.0 && keep <= 1.0))
    throw InvalidArgument(k + "keep must be in (0, 1], got " + num(keep));
  if (min_keys < 1) throw InvalidArgument(k + "min_keys must be >= 1, got " + num(min_keys));
  if (block < 1) throw InvalidArgument(k + "block must be >= 1, got " + num(block));
  if (buckets < 1) throw InvalidArgument(k + "buckets must be >= 1, got " + num(buckets));
  if (buckets > 1024) throw InvalidArgument(k + "buckets must be <= 1024, got " + num(buckets));
  if (!(step > 0.0) || !std::isfinite(step))
    throw InvalidArgument(k + "step must be a positive number, got " + num(step));
  if (scales != "buckets" && scales != "dynamic")
    throw InvalidArgument(k + "scales must be 'buckets' or 'dynamic', got '" + scales + "'");
  if (ratios != "calibrated" && ratios != "uniform")
    throw InvalidArgument(k + "ratios must be 'calibrated' or 'uniform', got '" + ratios + "'");
  if (certified != 0 && certified != 1)
    throw InvalidArgument(k + "certified must be 0 or 1, got " + num(certified));
  if (!(clamp_quantile > 0.0 && clamp_quantile <= 1.0))
    throw InvalidArgument(k + "clamp_quantile must be in (0, 1], got " + num(clamp_quantile));
}

json AttentionScheme::to_json() const {
  json j = {{"kind", attention_kind_name(kind)}};
  for (const auto& o : kind_options(kind)) {
    if (o == "keep") j[o] = keep;
    else if (o == "min_keys") j[o] = min_keys;
    else if (o == "ratios") j[o] = ratios;
    else if (o == "clamp_quantile") j[o] = clamp_quantile;
    else if (o == "block") j[o] = block;
    else if (o == "buckets") j[o] = buckets;
    else if (o == "step") j[o] = step;
    else if (o == "scales") j[o] = scales;
    else if (o == "certified") j[o] = certified;
  }
  return j;
}

AttentionScheme AttentionScheme::from_json(const json& j) {
  if (j.is_string()) return parse(j.get<std::string>());
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string())
    throw InvalidArgument("[AttentionScheme] expected a kind name (" + kind_list() +
                          ") or an object with a string 'kind', got " + json_text(j));
  AttentionScheme s;
  s.kind = attention_kind_from_name(j["kind"].get<std::string>());
  if (s.kind == AttentionKind::ShadowAttn) s.ratios = "calibrated";
  const auto allowed = kind_options(s.kind);
  const std::string who = std::string("[AttentionScheme] ") + attention_kind_name(s.kind);
  for (const auto& [key, v] : j.items()) {
    if (key == "kind") continue;
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      throw InvalidArgument(who + " has no option '" + key + "' (its options: " + join(allowed) +
                            ")");
    const bool text = key == "ratios" || key == "scales";
    const bool integer =
        key == "min_keys" || key == "block" || key == "buckets" || key == "certified";
    if (text ? !v.is_string() : !v.is_number() || (integer && !v.is_number_integer()))
      throw InvalidArgument(who + ": option '" + key + "' must be " +
                            (text      ? "a name"
                             : integer ? "an integer"
                                       : "a number") +
                            ", got " + json_text(v));
    if (key == "keep") s.keep = v.get<double>();
    else if (key == "min_keys") s.min_keys = v.get<int64_t>();
    else if (key == "ratios") s.ratios = v.get<std::string>();
    else if (key == "clamp_quantile") s.clamp_quantile = v.get<double>();
    else if (key == "block") s.block = v.get<int64_t>();
    else if (key == "buckets") s.buckets = v.get<int64_t>();
    else if (key == "step") s.step = v.get<double>();
    else if (key == "scales") s.scales = v.get<std::string>();
    else if (key == "certified") s.certified = v.get<int64_t>();
  }
  s.validate();
  return s;
}

AttentionScheme AttentionScheme::parse(const std::string& text) {
  return from_json(text_to_json(text));
}

json AttentionScheme::text_to_json(const std::string& text) {
  const auto kv = split_key_values(text, "[AttentionScheme]");
  json j = {{"kind", kv.head}};
  for (const auto& [key, value] : kv.items) j[key] = text_value(value);
  return j;
}

std::string AttentionScheme::label() const {
  std::string s = attention_kind_name(kind);
  if (is_sparse()) s += ":keep=" + num(keep);
  return s;
}

std::vector<std::pair<int, int>> bucket_offsets(int64_t n) {
  if (n < 1) throw InvalidArgument("[bucket_offsets] bucket count must be >= 1, got " + num(n));
  int ring = 0;
  while ((2 * ring + 1) * (2 * ring + 1) < n) ++ring;
  std::vector<std::pair<int, int>> all;
  for (int a = -ring; a <= ring; ++a)
    for (int b = -ring; b <= ring; ++b) all.emplace_back(a, b);
  std::sort(all.begin(), all.end(), [](auto x, auto y) {
    const auto key = [](std::pair<int, int> p) {
      return std::make_tuple(std::max(std::abs(p.first), std::abs(p.second)),
                             std::abs(p.first) + std::abs(p.second), p.first, p.second);
    };
    return key(x) < key(y);
  });
  all.resize(static_cast<size_t>(n));
  return all;
}

int64_t nearest_bucket(float lq, float lk, std::span<const float> bq, std::span<const float> bk) {
  if (bq.empty() || bq.size() != bk.size())
    throw ShapeError("[nearest_bucket] " + std::to_string(bq.size()) + " Q scales and " +
                     std::to_string(bk.size()) + " K scales");
  int64_t best = 0;
  double best_d = INFINITY;
  for (size_t i = 0; i < bq.size(); ++i) {
    const double dq = static_cast<double>(lq) - bq[i], dk = static_cast<double>(lk) - bk[i];
    const double d = 0.5 * (dq * dq + dk * dk);
    if (d < best_d) best_d = d, best = static_cast<int64_t>(i);
  }
  return best;
}

std::vector<double> head_keep_ratios(std::span<const float> head_importance,
                                     std::span<const float> layer_importance, int64_t n_heads,
                                     double keep, double clamp_quantile) {
  const int64_t L = static_cast<int64_t>(layer_importance.size());
  if (n_heads < 1 || static_cast<int64_t>(head_importance.size()) != L * n_heads)
    throw ShapeError("[head_keep_ratios] " + std::to_string(head_importance.size()) +
                     " head importances for " + std::to_string(L) + " layers of " +
                     std::to_string(n_heads) + " heads");
  if (!(keep > 0.0 && keep <= 1.0) || !(clamp_quantile > 0.0 && clamp_quantile <= 1.0))
    throw InvalidArgument("[head_keep_ratios] keep and clamp_quantile must be in (0, 1], got " +
                          num(keep) + " and " + num(clamp_quantile));
  const size_t N = head_importance.size();
  std::vector<double> c(N), positive;
  for (size_t i = 0; i < N; ++i) {
    const double h = head_importance[i], l = layer_importance[i / static_cast<size_t>(n_heads)];
    if (!std::isfinite(h) || !std::isfinite(l))
      throw InvalidArgument("[head_keep_ratios] importance of head " + std::to_string(i) +
                            " is not finite");
    c[i] = std::max(h, 0.0) * std::max(l, 0.0);
    if (c[i] > 0) positive.push_back(c[i]);
  }
  std::vector<double> r(N, keep);
  if (positive.empty()) return r;
  // The clamp, two-sided: products are bounded to the [1 - q, q] quantiles of the positive ones
  // (a head whose removal did not raise the loss gets the lower bound, not 0: keeping one key
  // replaces its output by one value row, a larger change than the ablation that measured it).
  const auto quantile = [&](double f) {
    const size_t i =
        static_cast<size_t>(std::max(0.0, std::ceil(f * static_cast<double>(positive.size())) - 1));
    std::nth_element(positive.begin(), positive.begin() + i, positive.end());
    return positive[i];
  };
  const double cap = quantile(clamp_quantile), floor = quantile(1.0 - clamp_quantile);
  for (double& x : c) x = std::clamp(x, floor, cap);
  // Water filling: heads at 1 keep 1, the budget left is shared by the others in proportion to
  // c (all c > 0 after the clamp).
  std::vector<bool> capped(N, false);
  const double total = keep * static_cast<double>(N);
  for (;;) {
    double budget = total, free_c = 0;
    for (size_t i = 0; i < N; ++i) (capped[i] ? budget -= 1.0 : free_c += c[i]);
    bool changed = false;
    for (size_t i = 0; i < N; ++i) {
      if (capped[i]) continue;
      r[i] = free_c > 0 ? budget * c[i] / free_c : 0.0;
      if (r[i] > 1.0) capped[i] = changed = true, r[i] = 1.0;
    }
    if (!changed) break;
  }
  return r;
}

int64_t keys_kept(int64_t visible, double ratio, int64_t min_keys) {
  const auto k = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(visible) - 1e-9));
  return std::min(visible, std::max(min_keys, k));
}

std::vector<BlockSparseQueryBlock> block_sparse_query_blocks(int64_t T, int64_t past, int64_t block,
                                                             int64_t window) {
  std::vector<BlockSparseQueryBlock> out;
  for (int64_t r0 = 0; r0 < T;) {
    const int64_t diagonal = (past + r0) / block;
    const int64_t end = std::min(T, (diagonal + 1) * block - past);
    out.push_back({r0, end - r0, kernels::first_visible_key(past + r0, window) / block, diagonal});
    r0 = end;
  }
  return out;
}

}  // namespace socllm::quant
