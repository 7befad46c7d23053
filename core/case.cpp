#include "core/case.hpp"

#include <cctype>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/rng.hpp"

namespace ulpgate {
namespace {

using json = nlohmann::json;

template <class E, std::size_t N>
std::optional<E> parse_enum(std::string_view t, const E (&all)[N]) {
  for (E e : all)
    if (name(e) == t) return e;
  return std::nullopt;
}

constexpr Op kOps[] = {Op::Gemm, Op::Attention, Op::AttentionBackward, Op::AttentionCombine};
constexpr Layout kLayouts[] = {Layout::RowMajor, Layout::ColMajor};
constexpr AttentionLayout kAttnLayouts[] = {AttentionLayout::BHSD, AttentionLayout::BSHD};
constexpr AlibiForm kAlibiForms[] = {AlibiForm::Flash, AlibiForm::FlashInfer};
constexpr Epilogue kEpilogues[] = {Epilogue::None,     Epilogue::Bias,     Epilogue::Relu,
                                   Epilogue::Gelu,     Epilogue::GeluTanh, Epilogue::BiasRelu,
                                   Epilogue::BiasGelu, Epilogue::BiasGeluTanh};

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw InputError(path + ": " + msg);
}

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// Reads one JSON object field by field, so that every message names the field's path and
// fields nobody asked for are reported as unknown (typos must not pass silently).
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail(path_, "must be a JSON object, got " + shown(j_));
  }
  std::string path(std::string_view key) const { return path_ + "." + std::string(key); }
  const json* find(std::string_view key) {
    seen_.insert(std::string(key));
    auto it = j_.find(std::string(key));
    return it == j_.end() ? nullptr : &*it;
  }
  const json& need(std::string_view key) {
    const json* v = find(key);
    if (!v) fail(path(key), "missing");
    return *v;
  }
  std::int64_t integer(std::string_view key, std::int64_t dflt, std::int64_t min_value) {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<std::uint64_t>() > INT64_MAX))
      fail(path(key), "must be an integer, got " + shown(*v));
    const auto x = v->get<std::int64_t>();
    if (x < min_value) fail(path(key), fmt::format("must be >= {}, got {}", min_value, x));
    return x;
  }
  bool boolean(std::string_view key, bool dflt) {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(path(key), "must be true or false, got " + shown(*v));
    return v->get<bool>();
  }
  double number(std::string_view key, double dflt) {
    const json* v = find(key);
    return v ? finite_number(*v, path(key)) : dflt;
  }
  template <class E, std::size_t N>
  E enumeration(std::string_view key, E dflt, const E (&all)[N]) {
    const json* v = find(key);
    if (!v) return dflt;
    std::string choices;
    for (E e : all) choices += (choices.empty() ? "" : ", ") + std::string(name(e));
    if (!v->is_string()) fail(path(key), "must be one of " + choices + ", got " + shown(*v));
    auto e = parse_enum(v->get<std::string>(), all);
    if (!e) fail(path(key), "must be one of " + choices + ", got " + shown(*v));
    return *e;
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) fail(path(it.key()), "unknown field");
  }

  // A finite double: a JSON number, or a string holding a C99 hex float ("0x1.8p+0") or
  // decimal, for values that must survive exactly.
  static double finite_number(const json& v, const std::string& p) {
    double x;
    if (v.is_number()) {
      x = v.get<double>();
    } else if (v.is_string()) {
      const std::string s = v.get<std::string>();
      char* end = nullptr;
      x = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0') fail(p, "must be a number, got " + shown(v));
    } else {
      fail(p, "must be a number, got " + shown(v));
    }
    if (!std::isfinite(x)) fail(p, "must be finite, got " + shown(v));
    return x;
  }

 private:
  const json& j_;
  std::string path_;
  std::set<std::string> seen_;
};

std::vector<std::string> operands_of(Op op) {
  if (op == Op::Gemm) return {"A", "B", "C", "D", "bias"};
  if (op == Op::AttentionBackward) return {"Q", "K", "V", "O", "LSE", "dO", "dQ", "dK", "dV"};
  if (op == Op::AttentionCombine) return {"O_part", "LSE_part", "O", "LSE"};
  return {"Q", "K", "V", "O", "LSE"};
}

// Each size at most kMaxCaseSize.
void check_sizes(const std::string& prefix, std::initializer_list<std::pair<const char*, std::int64_t>> sizes) {
  for (auto [key, v] : sizes)
    if (v > kMaxCaseSize) fail(prefix + key, fmt::format("must be at most {}, got {}", kMaxCaseSize, v));
}

// A buffer of the product of `factors` elements (each in [1, kMaxCaseSize], so the
// product of two fits in int64) is at most kMaxBufferElements; the message lists them.
void check_buffer(const std::string& where, const std::string& operand,
                  std::initializer_list<std::pair<std::string, std::int64_t>> factors) {
  std::int64_t elements = 1;
  bool over = false;
  std::string product;
  for (const auto& [label, v] : factors) {
    if (!over && v > kMaxBufferElements / elements) over = true;
    if (!over) elements *= v;
    product += fmt::format("{}{}{}", product.empty() ? "" : " x ", label, label.empty() ? fmt::format("{}", v) : fmt::format(" {}", v));
  }
  if (!over) return;
  // Over the cap: the exact count for the message (at most (2^31)^4 < 2^128).
  unsigned __int128 exact = 1;
  for (const auto& f : factors) exact *= static_cast<unsigned __int128>(f.second);
  std::string digits;
  for (; exact; exact /= 10) digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(exact % 10)));
  fail(where, fmt::format("{} holds {} elements ({}), above the limit of 2^40 per buffer", operand, digits, product));
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// attention_combine: batch, heads, seq_q, head_dim (the rows' width) and splits; every field
// of the attention forward's own (keys, masks, variants) at its default.
void validate_combine(const Case& c) {
  const auto& a = c.attention;
  for (auto [key, v] : {std::pair{"batch", a.batch}, {"heads", a.heads}, {"seq_q", a.seq_q}, {"head_dim", a.head_dim},
                        {"splits", a.splits}})
    if (v < 1) fail(std::string("case.attention.") + key, fmt::format("must be >= 1, got {}", v));
  check_sizes("case.attention.", {{"batch", a.batch}, {"heads", a.heads}, {"seq_q", a.seq_q}, {"head_dim", a.head_dim},
                                  {"splits", a.splits}});
  const AttentionShape none;
  for (auto [field, set] : {std::pair{"seq_kv", a.seq_kv != none.seq_kv}, {"head_dim_v", a.head_dim_v != 0},
                            {"kv_heads", a.kv_heads != 0}, {"causal", a.causal}, {"softmax_scale", a.softmax_scale.has_value()},
                            {"kv_lengths", !a.kv_lengths.empty()}, {"window_left", a.window_left != -1},
                            {"window_right", a.window_right != -1}, {"softcap", a.softcap != 0},
                            {"alibi_slopes", !a.alibi_slopes.empty()}, {"sinks", !a.sinks.empty()}, {"page_size", a.paged()},
                            {"num_pages", a.num_pages != 0}, {"page_table", !a.page_table.empty()}})
    if (set)
      fail(std::string("case.attention.") + field,
           "attention_combine merges partial states: it takes no keys, masks or variants (leave it at its default)");
  check_buffer("case.attention", "O_part", {{"splits", a.splits}, {"batch", a.batch}, {"heads", a.heads}, {"seq_q", a.seq_q},
                                            {"head_dim", a.head_dim}});
  for (const char* op : {"O_part", "O"})
    if (const auto t = c.types.find(op); t != c.types.end() && t->second != Format::FP32 && t->second != Format::FP16 &&
                                         t->second != Format::BF16)
      fail(std::string("case.types.") + op, fmt::format("must be fp32, fp16 or bf16, got {}", name(t->second)));
  if (const auto t = c.types.find("LSE_part"); t != c.types.end() && t->second != Format::FP32)
    fail("case.types.LSE_part", fmt::format("the partial log-sum-exps are fp32, got {}", name(t->second)));
  if (const auto t = c.types.find("compute"); t != c.types.end() && t->second != Format::FP32)
    fail("case.types.compute", fmt::format("attention_combine computes in fp32, got {}", name(t->second)));
}

}  // namespace

std::string_view name(Op o) {
  switch (o) {
    case Op::Gemm: return "gemm";
    case Op::Attention: return "attention";
    case Op::AttentionBackward: return "attention_backward";
    case Op::AttentionCombine: return "attention_combine";
  }
  return "?";
}
std::optional<Op> parse_op(std::string_view t) { return parse_enum(t, kOps); }
std::string primary_input(Op op) { return op == Op::Gemm ? "A" : op == Op::AttentionCombine ? "O_part" : "Q"; }
std::string_view name(Layout l) { return l == Layout::RowMajor ? "row" : "col"; }
std::string_view name(AttentionLayout l) { return l == AttentionLayout::BHSD ? "bhsd" : "bshd"; }
std::string_view name(AlibiForm f) { return f == AlibiForm::Flash ? "flash" : "flashinfer"; }
std::string_view name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::Bias: return "bias";
    case Epilogue::Relu: return "relu";
    case Epilogue::Gelu: return "gelu";
    case Epilogue::GeluTanh: return "gelu_tanh";
    case Epilogue::BiasRelu: return "bias_relu";
    case Epilogue::BiasGelu: return "bias_gelu";
    case Epilogue::BiasGeluTanh: return "bias_gelu_tanh";
  }
  return "?";
}
bool has_bias(Epilogue e) {
  return e == Epilogue::Bias || e == Epilogue::BiasRelu || e == Epilogue::BiasGelu ||
         e == Epilogue::BiasGeluTanh;
}

bool has_gelu(Epilogue e) {
  return e == Epilogue::Gelu || e == Epilogue::GeluTanh || e == Epilogue::BiasGelu || e == Epilogue::BiasGeluTanh;
}

std::vector<std::string> Case::inputs() const {
  if (op == Op::Attention) return {"Q", "K", "V"};
  if (op == Op::AttentionBackward) return {"Q", "K", "V", "dO"};
  if (op == Op::AttentionCombine) return {"O_part", "LSE_part"};
  std::vector<std::string> in{"A", "B"};
  if (beta != 0.0) in.push_back("C");
  if (has_bias(epilogue)) in.push_back("bias");
  return in;
}

std::vector<std::string> Case::derived_inputs() const {
  if (op == Op::AttentionBackward) return {"O", "LSE"};
  return {};
}

MatrixView gemm_view(const Case& c, std::string_view operand) {
  const auto& g = c.gemm;
  MatrixView v;
  v.layout = g.layout;
  v.batch = g.batch;
  if (operand == "A") {
    v.rows = g.a_rows(), v.cols = g.a_cols(), v.ld = g.eff_lda();
  } else if (operand == "B") {
    v.rows = g.b_rows(), v.cols = g.b_cols(), v.ld = g.eff_ldb();
  } else if (operand == "C") {
    v.rows = g.m, v.cols = g.n, v.ld = g.eff_ldc();
  } else if (operand == "D") {
    v.rows = g.m, v.cols = g.n, v.ld = g.eff_ldd();
  } else if (operand == "bias") {
    v.rows = 1, v.cols = g.n, v.batch = 1, v.layout = Layout::RowMajor, v.ld = g.n;
  } else {
    throw InputError(fmt::format("gemm has no operand '{}'", operand));
  }
  return v;
}

AttentionView attention_view(const Case& c, std::string_view operand) {
  const auto& a = c.attention;
  AttentionView v;
  v.batch = a.batch, v.heads = a.heads, v.seq = 0, v.dim = a.head_dim, v.layout = a.layout;
  const bool gradient = operand.size() == 2 && operand[0] == 'd';
  if (gradient && c.op != Op::AttentionBackward)
    throw InputError(fmt::format("{} has no operand '{}' (attention_backward has)", name(c.op), operand));
  if (gradient) operand.remove_prefix(1);  // dQ, dK, dV, dO: laid out as Q, K, V, O
  const bool part = operand == "O_part" || operand == "LSE_part";
  if (part != (c.op == Op::AttentionCombine) && (part || operand != "O" && operand != "LSE"))
    throw InputError(fmt::format("{} has no operand '{}'", name(c.op), operand));
  if (part) {  // the forward's O and LSE, splits x batch of them
    operand.remove_suffix(5);
    v.batch = a.splits * a.batch;
  }
  if (operand == "Q") {
    v.seq = a.seq_q;
  } else if (operand == "K") {
    v.seq = a.seq_kv, v.heads = a.eff_kv_heads();
  } else if (operand == "V") {
    v.seq = a.seq_kv, v.dim = a.eff_head_dim_v(), v.heads = a.eff_kv_heads();
  } else if (operand == "O") {
    v.seq = a.seq_q, v.dim = a.eff_head_dim_v();
  } else if (operand == "LSE") {
    v.seq = a.seq_q, v.dim = 1, v.layout = AttentionLayout::BHSD;  // [batch][heads][seq_q] whatever the layout
  } else {
    throw InputError(fmt::format("attention has no operand '{}'", operand));
  }
  if (a.paged() && (operand == "K" || operand == "V") && !gradient) {
    v.page_size = a.page_size, v.pages_per_seq = a.pages_per_seq(), v.num_pages = a.num_pages;
    v.page_table = std::make_shared<const std::vector<std::int64_t>>(a.page_table);
  }
  return v;
}

std::vector<std::int64_t> AttentionView::logical_offsets() const {
  std::vector<std::int64_t> at;
  at.reserve(static_cast<std::size_t>(elements()));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < seq; ++s)
        for (std::int64_t d = 0; d < dim; ++d) at.push_back(offset(b, h, s, d));
  return at;
}

std::int64_t operand_elements(const Case& c, std::string_view operand) {
  return c.op == Op::Gemm ? gemm_view(c, operand).elements() : attention_view(c, operand).elements();
}

KeyRange attention_visible_keys(const Case& c, std::int64_t b, std::int64_t i) {
  const auto& a = c.attention;
  const std::int64_t diag = i + (a.seq_kv - a.seq_q);  // the key on query i's diagonal
  KeyRange r{0, a.kv_lengths.empty() ? a.seq_kv : a.kv_lengths[static_cast<std::size_t>(b)]};
  if (a.causal) r.end = std::min(r.end, diag + 1);
  if (a.window_right >= 0) r.end = std::min(r.end, diag + a.window_right + 1);
  if (a.window_left >= 0) r.first = std::max<std::int64_t>(0, diag - a.window_left);
  if (r.end <= r.first) r.first = r.end = 0;
  return r;
}

std::int64_t attention_visible_count(const Case& c, std::int64_t b, std::int64_t i) {
  return attention_visible_keys(c, b, i).size();
}

bool attention_visible(const Case& c, std::int64_t b, std::int64_t i, std::int64_t j) {
  return attention_visible_keys(c, b, i).contains(j);
}

unsigned attention_variants(const Case& c) {
  if (c.op == Op::Gemm) return 0;
  const AttentionShape& a = c.attention;
  unsigned v = 0;
  if (a.windowed()) v |= kAttnWindow;
  if (a.softcap != 0) v |= kAttnSoftcap;
  if (!a.alibi_slopes.empty()) v |= kAttnAlibi;
  if (!a.sinks.empty()) v |= kAttnSinks;
  if (a.paged()) v |= kAttnPaged;
  if (c.scales.count("K") || c.scales.count("V")) v |= kAttnKvScales;
  if (!c.head_scales.empty()) v |= kAttnKvHeadScales;
  return v;
}

double input_scale(const Case& c, std::string_view operand, std::int64_t kv_head) {
  const std::string op(operand);
  if (const auto h = c.head_scales.find(op); h != c.head_scales.end()) return h->second.at(static_cast<std::size_t>(kv_head));
  const auto it = c.scales.find(op);
  return it == c.scales.end() ? 1.0 : it->second;
}

std::vector<double> kv_head_scales(const Case& c, std::string_view operand) {
  std::vector<double> out;
  for (std::int64_t hk = 0; hk < c.attention.eff_kv_heads(); ++hk) out.push_back(input_scale(c, operand, hk));
  return out;
}

PageUse page_use(const AttentionShape& a) {
  PageUse u;
  u.slots.assign(static_cast<std::size_t>(a.num_pages), 0);
  u.owner.assign(static_cast<std::size_t>(a.num_pages), -1);
  const std::int64_t per = a.pages_per_seq();
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t col = 0; col < a.pages_needed(); ++col) {
      const std::int64_t entry = b * per + col;
      const auto page = static_cast<std::size_t>(a.page_table[static_cast<std::size_t>(entry)]);
      const std::int64_t n = std::min(a.page_size, a.seq_kv - col * a.page_size);
      if (n > u.slots[page]) u.slots[page] = n, u.owner[page] = entry;
    }
  return u;
}

void page_kv(AttentionShape& a, std::int64_t page_size, std::uint64_t seed) {
  a.page_size = page_size;
  a.page_table.clear();
  a.num_pages = 0;
  if (page_size <= 0) return;
  const std::int64_t need = a.pages_needed();
  a.num_pages = a.batch * need + 1;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(a.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  for (std::size_t i = ids.size(); i > 1; --i)  // Fisher-Yates on the project's counter-based generator
    std::swap(ids[i - 1], ids[static_cast<std::size_t>(low64(random_block(seed, 0, i)) % i)]);
  a.page_table.assign(ids.begin(), ids.end() - 1);  // the last page: read by no row
}

Case unpaged(const Case& c) {
  Case t = c;
  AttentionShape& a = t.attention;
  a.page_size = 0, a.num_pages = 0;
  a.page_table.clear();
  return t;
}

std::string attention_variant_names(unsigned variants) {
  std::string out;
  for (const auto& [bit, what] : {std::pair{kAttnWindow, "window"}, std::pair{kAttnSoftcap, "soft cap"},
                                  std::pair{kAttnAlibi, "ALiBi"}, std::pair{kAttnSinks, "sinks"},
                                  std::pair{kAttnPaged, "paged K/V"}, std::pair{kAttnKvScales, "K/V scales"},
                                  std::pair{kAttnKvHeadScales, "per-head K/V scales"}})
    if (variants & bit) out += (out.empty() ? "" : ", ") + std::string(what);
  return out;
}

std::int64_t alibi_distance(const AttentionShape& a, std::int64_t i, std::int64_t j) {
  if (a.alibi_form == AlibiForm::FlashInfer) return j - i;
  const std::int64_t d = i + a.seq_kv - a.seq_q - j;
  return d < 0 ? d : -d;
}

std::vector<double> alibi_standard_slopes(std::int64_t heads) {
  std::int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<double> out;
  for (std::int64_t k = 1; k <= n && k <= heads; ++k)
    out.push_back(static_cast<float>(std::exp2(-8.0 * static_cast<double>(k) / static_cast<double>(n))));
  for (std::int64_t k = 1; static_cast<std::int64_t>(out.size()) < heads; k += 2)
    out.push_back(static_cast<float>(std::exp2(-4.0 * static_cast<double>(k) / static_cast<double>(n))));
  return out;
}

std::pair<std::int64_t, std::int64_t> window_from_convention(const std::string& spec) {
  const auto bad = [&](const std::string& why) -> std::pair<std::int64_t, std::int64_t> {
    throw InputError(fmt::format("window '{}': {} (flash:LEFT,RIGHT, hf:W, flashinfer:LEFT or cudnn:LEFT_BOUND[,RIGHT_BOUND])",
                                 spec, why));
  };
  const auto colon = spec.find(':');
  if (colon == std::string::npos) return bad("no convention");
  const std::string conv = spec.substr(0, colon);
  std::vector<std::int64_t> v;
  std::size_t at = colon + 1;
  while (at <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string part = spec.substr(at, comma - at);
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size()) return bad(fmt::format("'{}' is not an integer", part));
    v.push_back(x);
    at = comma + 1;
  }
  const auto count = [&](std::size_t lo, std::size_t hi) {
    if (v.size() < lo || v.size() > hi) bad(fmt::format("{} takes {} value{}", conv, lo == hi ? std::to_string(lo) : "1 or 2", hi > 1 ? "s" : ""));
  };
  if (conv == "flash") {
    count(2, 2);
    if (v[0] < -1 || v[1] < -1) return bad("each side is -1 (unbounded) or at least 0");
    return {v[0], v[1]};
  }
  if (conv == "hf") {
    count(1, 1);
    if (v[0] < 1) return bad("sliding_window counts keys, self included: at least 1");
    return {v[0] - 1, 0};
  }
  if (conv == "flashinfer") {
    count(1, 1);
    if (v[0] < -1) return bad("window_left is -1 (none) or at least 0");
    return {v[0], -1};
  }
  if (conv == "cudnn") {
    count(1, 2);
    if (v[0] < 1) return bad("diagonal_band_left_bound is at least 1 (1 keeps the diagonal key only)");
    if (v.size() == 2 && v[1] < 0) return bad("diagonal_band_right_bound is at least 0");
    return {v[0] - 1, v.size() == 2 ? v[1] : -1};
  }
  return bad(fmt::format("unknown convention '{}'", conv));
}

namespace {

// "x" or "x1,x2,...": numbers (strtod's, so "-inf" and "inf" too), each rounded to FP32.
std::vector<double> fp32_list(const std::string& flag, const std::string& spec, const std::string& text) {
  std::vector<double> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    char* end = nullptr;
    const double x = std::strtod(part.c_str(), &end);
    if (part.empty() || *end || std::isnan(x))
      throw InputError(fmt::format("{} '{}': '{}' is not a number", flag, spec, part));
    out.push_back(static_cast<float>(x));
    at = comma + 1;
  }
  return out;
}

// One value for every head, or one per head.
std::vector<double> per_head_values(const std::string& flag, const std::string& spec, const std::string& text,
                                    std::int64_t heads) {
  std::vector<double> v = fp32_list(flag, spec, text);
  if (v.size() == 1) v.assign(static_cast<std::size_t>(heads), v.front());
  if (static_cast<std::int64_t>(v.size()) != heads)
    throw InputError(fmt::format("{} '{}': one value or one per query head ({}), got {}", flag, spec, heads, v.size()));
  return v;
}

}  // namespace

void apply_served_variants(AttentionShape& a, const ServedVariantSpecs& specs) {
  if (!specs.window.empty()) std::tie(a.window_left, a.window_right) = window_from_convention(specs.window);
  if (!specs.softcap.empty()) {
    const std::vector<double> v = fp32_list("--softcap", specs.softcap, specs.softcap);
    if (v.size() != 1 || !(v[0] > 0) || !std::isfinite(v[0]))
      throw InputError(fmt::format("--softcap '{}': one positive finite cap", specs.softcap));
    a.softcap = v[0];
  }
  if (!specs.alibi.empty()) {
    const std::size_t colon = specs.alibi.find(':');
    const std::string form = specs.alibi.substr(0, colon);
    if (form == "flash") a.alibi_form = AlibiForm::Flash;
    else if (form == "flashinfer") a.alibi_form = AlibiForm::FlashInfer;
    else throw InputError(fmt::format("--alibi '{}': the form is flash or flashinfer, then :SLOPE or :S1,S2,... optionally", specs.alibi));
    a.alibi_slopes = colon == std::string::npos ? alibi_standard_slopes(a.heads)
                                                : per_head_values("--alibi", specs.alibi, specs.alibi.substr(colon + 1), a.heads);
    for (double x : a.alibi_slopes)
      if (!std::isfinite(x)) throw InputError(fmt::format("--alibi '{}': slopes are finite", specs.alibi));
  }
  if (!specs.sinks.empty()) {
    a.sinks = per_head_values("--sinks", specs.sinks, specs.sinks, a.heads);
    for (double x : a.sinks)
      if (x == INFINITY) throw InputError(fmt::format("--sinks '{}': a sink is finite or -inf (none)", specs.sinks));
  }
  if (!specs.pages.empty()) {
    char* end = nullptr;
    const long long p = std::strtoll(specs.pages.c_str(), &end, 10);
    if (*end || p < 1 || p > kMaxCaseSize)
      throw InputError(fmt::format("--page-size '{}': a page size of at least 1 key", specs.pages));
    page_kv(a, p, 0);
  }
}

void apply_kv_cache(Case& c, const std::string& spec, bool k_drawn_with_q) {
  const auto bad = [&](const std::string& why) {
    return InputError(fmt::format("--kv-cache '{}': {} (e4m3 or e5m2, optionally :FRAC with FRAC in (0, 1], then :head for a "
                                  "scale per K/V head)",
                                  spec, why));
  };
  if (c.op != Op::Attention) throw bad("an FP8 K/V cache is for the attention forward");
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const std::size_t colon = spec.find(':', at);
    parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  const auto f = parse_format(parts[0]);
  if (!f || (*f != Format::E4M3 && *f != Format::E5M2)) throw bad(fmt::format("'{}' is not an FP8 format", parts[0]));
  double frac = 1.0;
  bool per_head = false;
  if (parts.size() > 3) throw bad("too many ':' parts");
  if (parts.size() >= 2) {
    char* end = nullptr;
    frac = std::strtod(parts[1].c_str(), &end);
    if (parts[1].empty() || *end || !(frac > 0 && frac <= 1)) throw bad(fmt::format("'{}' is not a fraction in (0, 1]", parts[1]));
  }
  if (parts.size() == 3) {
    if (parts[2] != "head") throw bad(fmt::format("'{}' is not 'head'", parts[2]));
    per_head = true;
  }
  for (const char* op : {"K", "V"}) {
    c.types[op] = *f;
    if (op[0] == 'K' && k_drawn_with_q) continue;
    const auto it = c.dist.find(op);
    const std::string base = it == c.dist.end() || it->second.empty() ? "normal(0,1)" : it->second;
    c.dist[op] = fmt::format("amax(frac={}{},base={})", frac, per_head ? ",per_head=1,spread=4" : "", base);
  }
}

std::string shape_text(const Case& c, bool with_order) {
  if (c.op == Op::Gemm) {
    const GemmShape& g = c.gemm;
    const char* order = !with_order ? "" : g.batch > 1 ? " (batch x M x N x K)" : " (M x N x K)";
    return fmt::format("{}{}x{}x{}{}", g.batch > 1 ? fmt::format("{} x ", g.batch) : "", g.m, g.n, g.k, order);
  }
  const AttentionShape& a = c.attention;
  if (c.op == Op::AttentionCombine)
    return fmt::format("B{} H{} Sq{} D{} splits {}{}", a.batch, a.heads, a.seq_q, a.head_dim, a.splits,
                       a.lse_base2 ? " LSE base 2" : "");
  return fmt::format("B{} H{}{} Sq{} Skv{} D{}{}{}", a.batch, a.heads,
                     a.eff_kv_heads() != a.heads ? fmt::format("/{}", a.eff_kv_heads()) : "", a.seq_q, a.seq_kv, a.head_dim,
                     a.eff_head_dim_v() != a.head_dim ? fmt::format("/{}", a.eff_head_dim_v()) : "",
                     a.windowed() ? fmt::format(" window({},{})", a.window_left, a.window_right) : "") +
         (a.softcap != 0 ? fmt::format(" softcap({})", a.softcap) : "") +
         (a.alibi_slopes.empty() ? "" : fmt::format(" alibi({})", name(a.alibi_form))) + (a.sinks.empty() ? "" : " sinks") +
         (a.paged() ? fmt::format(" paged({}x{})", a.num_pages, a.page_size) : "");
}

void validate(const Case& c) {
  const auto ops = operands_of(c.op);
  if (c.op == Op::Gemm) {
    const auto& g = c.gemm;
    for (auto [key, v] : {std::pair{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", g.batch}})
      if (v < 1) fail(std::string("case.gemm.") + key, fmt::format("must be >= 1, got {}", v));
    check_sizes("case.gemm.", {{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", g.batch}, {"lda", g.lda}, {"ldb", g.ldb},
                               {"ldc", g.ldc}, {"ldd", g.ldd}});
    struct Ld { const char* key; std::int64_t ld, rows, cols; };
    for (const Ld& l : {Ld{"lda", g.lda, g.a_rows(), g.a_cols()},
                        Ld{"ldb", g.ldb, g.b_rows(), g.b_cols()}, Ld{"ldc", g.ldc, g.m, g.n},
                        Ld{"ldd", g.ldd, g.m, g.n}}) {
      const std::int64_t need = g.packed_ld(l.rows, l.cols);
      if (l.ld != 0 && l.ld < need)
        fail(std::string("case.gemm.") + l.key,
             fmt::format("must be 0 (packed) or >= {} for a {} {}x{} matrix, got {}", need,
                         name(g.layout) == "row" ? "row-major" : "column-major", l.rows, l.cols,
                         l.ld));
    }
    // C is allocated only when beta != 0, but its ldc is checked like the others.
    for (const char* op : {"A", "B", "C", "D"}) {
      const MatrixView v = gemm_view(c, op);
      const std::int64_t major = g.layout == Layout::RowMajor ? v.rows : v.cols;
      check_buffer("case.gemm", op, {{"batch", v.batch}, {"", major}, {fmt::format("ld{}", char(std::tolower(*op))), v.ld}});
    }
  } else if (c.op == Op::AttentionCombine) {
    validate_combine(c);
  } else {
    const auto& a = c.attention;
    for (auto [key, v] : {std::pair{"batch", a.batch}, {"heads", a.heads}, {"seq_q", a.seq_q},
                          {"seq_kv", a.seq_kv}, {"head_dim", a.head_dim}})
      if (v < 1) fail(std::string("case.attention.") + key, fmt::format("must be >= 1, got {}", v));
    if (a.head_dim_v < 0)
      fail("case.attention.head_dim_v", fmt::format("must be >= 0, got {}", a.head_dim_v));
    if (a.kv_heads < 0 || a.kv_heads > a.heads || (a.kv_heads > 0 && a.heads % a.kv_heads != 0))
      fail("case.attention.kv_heads",
           fmt::format("must be 0 (= heads) or a divisor of heads={} (grouped-query attention), got {}", a.heads,
                       a.kv_heads));
    check_sizes("case.attention.", {{"batch", a.batch}, {"heads", a.heads}, {"seq_q", a.seq_q}, {"seq_kv", a.seq_kv},
                                    {"head_dim", a.head_dim}, {"head_dim_v", a.head_dim_v},
                                    {"page_size", a.page_size}, {"num_pages", a.num_pages}});
    if (a.page_size < 0) fail("case.attention.page_size", fmt::format("must be 0 (contiguous K/V) or >= 1, got {}", a.page_size));
    if (!a.paged() && (a.num_pages != 0 || !a.page_table.empty()))
      fail(a.num_pages != 0 ? "case.attention.num_pages" : "case.attention.page_table",
           "must be absent (0, empty) when page_size is 0 (contiguous K/V)");
    if (a.paged()) {
      if (c.op == Op::AttentionBackward) fail("case.attention.page_size", "paged K/V is forward-only (must be 0)");
      if (a.num_pages < 1) fail("case.attention.num_pages", fmt::format("must be >= 1 with paged K/V, got {}", a.num_pages));
      const auto rows = static_cast<std::int64_t>(a.page_table.size());
      if (rows % a.batch != 0 || rows / a.batch < a.pages_needed())
        fail("case.attention.page_table",
             fmt::format("must have batch={} rows of at least ceil(seq_kv / page_size) = {} entries each, got {} entries",
                         a.batch, a.pages_needed(), rows));
      for (std::size_t e = 0; e < a.page_table.size(); ++e)
        if (a.page_table[e] < 0 || a.page_table[e] >= a.num_pages)
          fail(fmt::format("case.attention.page_table[{}]", e),
               fmt::format("must be a page in [0, num_pages={}), got {}", a.num_pages, a.page_table[e]));
    }
    for (const char* op : {"Q", "K", "V", "O"}) {  // the gradients are laid out as these
      const AttentionView v = attention_view(c, op);
      check_buffer("case.attention", op, {{"batch", v.batch}, {(op[0] == 'K' || op[0] == 'V') && a.kv_heads ? "kv_heads" : "heads", v.heads},
                                          {op[0] == 'Q' || op[0] == 'O' ? "seq_q" : "seq_kv", v.seq},
                                          {op[0] == 'V' || op[0] == 'O' ? "head_dim_v" : "head_dim", v.dim}});
      if (v.paged())
        check_buffer("case.attention", op, {{"num_pages", v.num_pages}, {"page_size", v.page_size},
                                            {a.kv_heads ? "kv_heads" : "heads", v.heads},
                                            {op[0] == 'V' ? "head_dim_v" : "head_dim", v.dim}});
    }
    if (a.window_left < -1 || a.window_right < -1)
      fail(a.window_left < -1 ? "case.attention.window_left" : "case.attention.window_right",
           fmt::format("must be -1 (unbounded) or at least 0, got {}", std::min(a.window_left, a.window_right)));
    if (a.window_left > kMaxCaseSize || a.window_right > kMaxCaseSize)
      fail(a.window_left > kMaxCaseSize ? "case.attention.window_left" : "case.attention.window_right",
           fmt::format("must be at most {}", kMaxCaseSize));
    if (a.softmax_scale && !std::isfinite(*a.softmax_scale))
      fail("case.attention.softmax_scale", "must be finite");
    const auto fp32 = [](double x) { return static_cast<double>(static_cast<float>(x)) == x; };
    if (!std::isfinite(a.softcap) || a.softcap < 0 || !fp32(a.softcap))
      fail("case.attention.softcap", fmt::format("must be 0 (none) or a positive finite FP32 value, got {}", a.softcap));
    const auto per_head = [&](const std::vector<double>& v, const char* field, bool minus_inf) {
      if (v.empty()) return;
      if (static_cast<std::int64_t>(v.size()) != a.heads)
        fail(fmt::format("case.attention.{}", field), fmt::format("must have one entry per query head ({}), got {}", a.heads, v.size()));
      for (std::size_t h = 0; h < v.size(); ++h)
        if (!(std::isfinite(v[h]) || (minus_inf && v[h] == -INFINITY)) || !fp32(v[h]))
          fail(fmt::format("case.attention.{}[{}]", field, h),
               fmt::format("must be a finite FP32 value{}, got {}", minus_inf ? " or -inf" : "", v[h]));
    };
    per_head(a.alibi_slopes, "alibi_slopes", false);
    per_head(a.sinks, "sinks", true);
    if (c.op == Op::AttentionBackward && (a.softcap != 0 || !a.alibi_slopes.empty() || !a.sinks.empty()))
      fail("case.attention", "soft-capping, ALiBi and sinks are forward-only for now (the backward reference lacks them)");
    if (!a.kv_lengths.empty()) {
      if (static_cast<std::int64_t>(a.kv_lengths.size()) != a.batch)
        fail("case.attention.kv_lengths",
             fmt::format("must have one entry per batch ({}), got {}", a.batch, a.kv_lengths.size()));
      for (std::size_t i = 0; i < a.kv_lengths.size(); ++i)
        if (a.kv_lengths[i] < 0 || a.kv_lengths[i] > a.seq_kv)
          fail(fmt::format("case.attention.kv_lengths[{}]", i),
               fmt::format("must be in [0, seq_kv={}], got {}", a.seq_kv, a.kv_lengths[i]));
    }
  }
  for (const auto& [op, f] : c.types)
    if (op != "compute" && !contains(ops, op))
      fail("case.types." + op, fmt::format("unknown operand for {}", name(c.op)));
  std::vector<std::string> required =
      c.op == Op::Gemm                ? std::vector<std::string>{"A", "B", "D", "compute"}
      : c.op == Op::AttentionBackward ? std::vector<std::string>{"Q", "K", "V", "O", "LSE", "dO", "dQ", "dK", "dV", "compute"}
      : c.op == Op::AttentionCombine  ? std::vector<std::string>{"O_part", "LSE_part", "O", "compute"}
                                      : std::vector<std::string>{"Q", "K", "V", "O", "compute"};
  if (c.op == Op::Gemm && c.beta != 0.0) required.push_back("C");
  if (c.op == Op::Gemm && has_bias(c.epilogue)) required.push_back("bias");
  for (const auto& op : required)
    if (!c.types.count(op))
      fail("case.types." + op, op == "C"      ? "missing (required when beta != 0)"
                               : op == "bias" ? "missing (required by the bias epilogue)"
                               : op == "LSE" && c.op == Op::AttentionBackward ? "missing (the backward pass reads the forward's LSE, fp32)"
                                              : "missing");
  if (c.op != Op::AttentionCombine && (c.attention.splits != 1 || c.attention.lse_base2))
    fail(c.attention.splits != 1 ? "case.attention.splits" : "case.attention.lse_base",
         fmt::format("only attention_combine cases merge splits (this one is {})", name(c.op)));
  if (const auto lse = c.types.find("LSE"); lse != c.types.end() && lse->second != Format::FP32)
    fail("case.types.LSE", fmt::format("the log-sum-exp output is fp32, got {}", name(lse->second)));
  if (!std::isfinite(c.alpha)) fail("case.alpha", "must be finite");
  if (!std::isfinite(c.beta)) fail("case.beta", "must be finite");
  if (c.op != Op::Gemm && c.epilogue != Epilogue::None)
    fail("case.epilogue", "attention takes no epilogue");
  // A scale's value, and its operand: FP8 only. A kernel for a wider format has no scale to
  // apply (cuBLASLt's scale pointers are FP8-only, the plugin ABI passes 1): a scale there
  // would make the reference and the kernel compute different products.
  const auto positive = [](const std::string& field, double s) {
    if (!(std::isfinite(s) && s > 0)) fail(field, fmt::format("must be finite and > 0, got {}", s));
  };
  const auto fp8_only = [&c](const std::string& field, const std::string& op) {
    const auto t = c.types.find(op);
    if (t == c.types.end()) fail(field, fmt::format("scales apply only to FP8 operands (this case has no {})", op));
    if (!takes_scale(t->second)) fail(field, fmt::format("scales apply only to FP8 operands ({} is {})", op, name(t->second)));
  };
  for (const auto& [op, s] : c.scales) {
    if (!(c.op == Op::Gemm ? op == "A" || op == "B" || op == "C" || op == "D" : c.op == Op::Attention && (op == "K" || op == "V")))
      fail("case.scales." + op, "unknown scale (GEMM scales are A, B, C, D; attention's K and V, an FP8 K/V cache)");
    positive("case.scales." + op, s);
    fp8_only("case.scales." + op, op);
  }
  for (const auto& [op, v] : c.head_scales) {
    if (c.op != Op::Attention || (op != "K" && op != "V"))
      fail("case.head_scales." + op, "unknown scale (per-head scales are the attention forward's K and V, an FP8 K/V cache)");
    if (c.scales.count(op)) fail("case.head_scales." + op, fmt::format("{} has a tensor scale too (case.scales.{})", op, op));
    const std::int64_t kv_heads = c.attention.eff_kv_heads();
    if (static_cast<std::int64_t>(v.size()) != kv_heads)
      fail("case.head_scales." + op, fmt::format("must have one scale per K/V head ({}), got {}", kv_heads, v.size()));
    for (std::size_t h = 0; h < v.size(); ++h) positive(fmt::format("case.head_scales.{}[{}]", op, h), v[h]);
    fp8_only("case.head_scales." + op, op);
  }
  const auto in = c.inputs();
  for (const auto& [op, spec] : c.dist) {
    if (!contains(in, op))
      fail("case.dist." + op, fmt::format("not an input operand of this case ({})",
                                          fmt::join(in, ", ")));
    if (spec.empty()) fail("case.dist." + op, "empty distribution spec");
    if (const std::string problem = control_character_problem(spec); !problem.empty()) fail("case.dist." + op, problem);
  }
  if (!c.forward_kernel.empty()) {
    if (c.op != Op::AttentionBackward)
      fail("case.forward_kernel", fmt::format("only attention_backward cases take a forward kernel, this one is {}", name(c.op)));
    if (const std::string problem = control_character_problem(c.forward_kernel); !problem.empty())
      fail("case.forward_kernel", problem);
  }
}

json to_json(const Case& c) {
  json j;
  j["ulpgate_case"] = kCaseSchemaVersion;
  j["op"] = name(c.op);
  j["kernel"] = c.kernel;
  if (c.op == Op::Gemm) {
    const auto& g = c.gemm;
    j["gemm"] = {{"m", g.m},     {"n", g.n},         {"k", g.k},         {"batch", g.batch},
                 {"layout", name(g.layout)}, {"trans_a", g.trans_a}, {"trans_b", g.trans_b},
                 {"lda", g.lda}, {"ldb", g.ldb},     {"ldc", g.ldc},     {"ldd", g.ldd}};
  } else {
    const auto& a = c.attention;
    j["attention"] = {{"batch", a.batch},       {"heads", a.heads},
                      {"seq_q", a.seq_q},       {"seq_kv", a.seq_kv},
                      {"head_dim", a.head_dim}, {"head_dim_v", a.head_dim_v},
                      {"kv_heads", a.kv_heads},
                      {"layout", name(a.layout)}, {"causal", a.causal},
                      {"softmax_scale", a.softmax_scale ? json(*a.softmax_scale) : json(nullptr)},
                      {"kv_lengths", a.kv_lengths},
                      {"window_left", a.window_left}, {"window_right", a.window_right}};
    json& at = j["attention"];
    if (a.softcap != 0) at["softcap"] = a.softcap;
    if (!a.alibi_slopes.empty()) at["alibi_slopes"] = a.alibi_slopes, at["alibi_form"] = name(a.alibi_form);
    if (!a.sinks.empty()) {
      json sinks = json::array();  // -inf (no sink for that head) as the string "-inf"
      for (double x : a.sinks) sinks.push_back(x == -INFINITY ? json("-inf") : json(x));
      at["sinks"] = sinks;
    }
    if (a.paged()) at["page_size"] = a.page_size, at["num_pages"] = a.num_pages, at["page_table"] = a.page_table;
    if (c.op == Op::AttentionCombine) at["splits"] = a.splits, at["lse_base"] = a.lse_base2 ? "2" : "e";
  }
  json types = json::object();
  for (const auto& [op, f] : c.types) types[op] = name(f);
  j["types"] = types;
  j["alpha"] = c.alpha;
  j["beta"] = c.beta;
  j["epilogue"] = name(c.epilogue);
  j["scales"] = c.scales;
  if (!c.head_scales.empty()) j["head_scales"] = c.head_scales;
  j["dist"] = c.dist;
  j["seed"] = c.seed;
  if (!c.forward_kernel.empty()) j["forward_kernel"] = c.forward_kernel;
  return j;
}

Case case_from_json(const json& j) {
  ObjectReader r(j, "case");
  const json& version = r.need("ulpgate_case");
  if (!version.is_number_integer() || version.get<std::int64_t>() != kCaseSchemaVersion)
    fail("case.ulpgate_case",
         fmt::format("unsupported case version {} (this build reads {})", shown(version),
                     kCaseSchemaVersion));
  Case c;
  c.op = r.enumeration("op", Op::Gemm, kOps);
  if (const json* k = r.find("kernel")) {
    if (!k->is_string()) fail("case.kernel", "must be a string, got " + shown(*k));
    c.kernel = k->get<std::string>();
  }
  const char* other = c.op == Op::Gemm ? "attention" : "gemm";  // backward cases use "attention" too
  if (r.find(other)) fail(std::string("case.") + other, fmt::format("not allowed when op is {}", name(c.op)));
  if (c.op == Op::Gemm) {
    ObjectReader g(r.need("gemm"), "case.gemm");
    auto& s = c.gemm;
    s.m = g.integer("m", 1, 1);
    s.n = g.integer("n", 1, 1);
    s.k = g.integer("k", 1, 1);
    s.batch = g.integer("batch", 1, 1);
    s.layout = g.enumeration("layout", Layout::RowMajor, kLayouts);
    s.trans_a = g.boolean("trans_a", false);
    s.trans_b = g.boolean("trans_b", false);
    s.lda = g.integer("lda", 0, 0);
    s.ldb = g.integer("ldb", 0, 0);
    s.ldc = g.integer("ldc", 0, 0);
    s.ldd = g.integer("ldd", 0, 0);
    g.finish();
  } else {
    ObjectReader a(r.need("attention"), "case.attention");
    auto& s = c.attention;
    s.batch = a.integer("batch", 1, 1);
    s.heads = a.integer("heads", 1, 1);
    s.seq_q = a.integer("seq_q", 1, 1);
    s.seq_kv = a.integer("seq_kv", 1, 1);
    s.head_dim = a.integer("head_dim", 64, 1);
    s.head_dim_v = a.integer("head_dim_v", 0, 0);
    s.kv_heads = a.integer("kv_heads", 0, 0);  // absent in files written before GQA: heads
    s.layout = a.enumeration("layout", AttentionLayout::BHSD, kAttnLayouts);
    s.causal = a.boolean("causal", false);
    s.window_left = a.integer("window_left", -1, -1);  // absent in files written before windows: none
    s.window_right = a.integer("window_right", -1, -1);
    if (const json* sc = a.find("softmax_scale"); sc && !sc->is_null())
      s.softmax_scale = ObjectReader::finite_number(*sc, "case.attention.softmax_scale");
    s.softcap = a.number("softcap", 0.0);  // absent: none (as in files written before variants)
    s.alibi_form = a.enumeration("alibi_form", AlibiForm::Flash, kAlibiForms);
    const auto numbers = [&](const char* field, std::vector<double>& out) {
      const json* v = a.find(field);
      if (!v) return;
      if (!v->is_array()) fail(fmt::format("case.attention.{}", field), "must be an array of numbers");
      for (std::size_t i = 0; i < v->size(); ++i) {
        const json& e = (*v)[i];
        if (e.is_string() && e.get<std::string>() == "-inf") out.push_back(-INFINITY);
        else if (e.is_number()) out.push_back(e.get<double>());
        else fail(fmt::format("case.attention.{}[{}]", field, i), "must be a number or \"-inf\", got " + shown(e));
      }
    };
    numbers("alibi_slopes", s.alibi_slopes);
    numbers("sinks", s.sinks);
    const auto integers = [&](const char* field, std::vector<std::int64_t>& out) {
      const json* v = a.find(field);
      if (!v) return;
      if (!v->is_array()) fail(fmt::format("case.attention.{}", field), "must be an array of integers");
      for (std::size_t i = 0; i < v->size(); ++i) {
        const json& e = (*v)[i];
        if (!e.is_number_integer())
          fail(fmt::format("case.attention.{}[{}]", field, i), "must be an integer, got " + shown(e));
        out.push_back(e.get<std::int64_t>());
      }
    };
    integers("kv_lengths", s.kv_lengths);
    s.page_size = a.integer("page_size", 0, 0);  // absent: contiguous K/V
    s.num_pages = a.integer("num_pages", 0, 0);
    integers("page_table", s.page_table);
    s.splits = a.integer("splits", 1, 1);
    if (const json* base = a.find("lse_base")) {
      if (!base->is_string() || (*base != "e" && *base != "2"))
        fail("case.attention.lse_base", "must be \"e\" (natural log) or \"2\" (log2), got " + shown(*base));
      s.lse_base2 = *base == "2";
    }
    a.finish();
  }
  {
    ObjectReader t(r.need("types"), "case.types");
    for (const auto& [op, v] : r.need("types").items()) {
      t.find(op);
      const auto f = v.is_string() ? parse_format(v.get<std::string>()) : std::nullopt;
      if (!f) fail("case.types." + op, "unknown format " + shown(v) + " (see `ulpgate list`)");
      c.types[op] = *f;
    }
  }
  c.alpha = r.number("alpha", 1.0);
  c.beta = r.number("beta", 0.0);
  c.epilogue = r.enumeration("epilogue", Epilogue::None, kEpilogues);
  if (const json* s = r.find("scales")) {
    ObjectReader sr(*s, "case.scales");
    for (const auto& [op, v] : s->items()) c.scales[op] = sr.number(op, 1.0);
  }
  if (const json* s = r.find("head_scales")) {
    ObjectReader sr(*s, "case.head_scales");
    for (const auto& [op, v] : s->items()) {
      sr.find(op);
      if (!v.is_array()) fail(sr.path(op), "must be an array of numbers (one per K/V head)");
      for (std::size_t i = 0; i < v.size(); ++i)
        c.head_scales[op].push_back(ObjectReader::finite_number(v[i], fmt::format("{}[{}]", sr.path(op), i)));
    }
  }
  if (const json* d = r.find("dist")) {
    ObjectReader dr(*d, "case.dist");
    for (const auto& [op, v] : d->items()) {
      dr.find(op);
      if (!v.is_string()) fail("case.dist." + op, "must be a distribution spec string, got " + shown(v));
      c.dist[op] = v.get<std::string>();
    }
  }
  if (const json* s = r.find("seed")) {
    if (s->is_number_unsigned() || (s->is_number_integer() && s->get<std::int64_t>() >= 0)) {
      c.seed = s->get<std::uint64_t>();
    } else {
      fail("case.seed", "must be an unsigned 64-bit integer, got " + shown(*s));
    }
  }
  if (const json* f = r.find("forward_kernel")) {
    if (!f->is_string()) fail("case.forward_kernel", "must be a kernel name string, got " + shown(*f));
    c.forward_kernel = f->get<std::string>();
  }
  r.finish();
  validate(c);
  return c;
}

Case read_case_file(const std::string& path) { return read_json_file_as(path, case_from_json, "case file"); }

void write_case_file(const std::string& path, const Case& c) {
  write_text_file_atomically(path, to_json(c).dump(2) + "\n");
}

}  // namespace ulpgate
