#include "graphtrain/symbolic.h"

#include <algorithm>
#include <atomic>
#include <cctype>

#include "graphtrain/strings.h"

namespace graphtrain {

SymDim::SymDim(int64_t value) {
  if (value != 0) terms_[{}] = value;
}

SymDim SymDim::symbol(std::string name) {
  SymDim d;
  d.terms_[{std::move(name)}] = 1;
  return d;
}

SymDim SymDim::fresh(std::string_view hint) {
  static std::atomic<int64_t> counter{0};
  return symbol(str_cat("_", hint, counter.fetch_add(1)));
}

namespace {

bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// term := factor ('*' factor)* ; factor := integer | identifier
std::optional<SymDim> parse_term(std::string_view t) {
  SymDim result(1);
  size_t start = 0;
  while (start <= t.size()) {
    size_t end = t.find('*', start);
    if (end == std::string_view::npos) end = t.size();
    std::string_view f = t.substr(start, end - start);
    while (!f.empty() && f.front() == ' ') f.remove_prefix(1);
    while (!f.empty() && f.back() == ' ') f.remove_suffix(1);
    if (f.empty()) return std::nullopt;
    if (std::all_of(f.begin(), f.end(), [](char c) { return std::isdigit((unsigned char)c); })) {
      result = result * SymDim(std::stoll(std::string(f)));
    } else if (!std::isdigit(static_cast<unsigned char>(f.front())) &&
               std::all_of(f.begin(), f.end(), is_ident_char)) {
      result = result * SymDim::symbol(std::string(f));
    } else {
      return std::nullopt;
    }
    start = end + 1;
  }
  return result;
}

}  // namespace

SymDim SymDim::parse(std::string_view text) {
  SymDim sum;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('+', start);
    if (end == std::string_view::npos) end = text.size();
    auto term = parse_term(text.substr(start, end - start));
    if (!term) return symbol(std::string(text));
    sum = sum + *term;
    start = end + 1;
  }
  return sum;
}

bool SymDim::is_constant() const {
  return terms_.empty() || (terms_.size() == 1 && terms_.begin()->first.empty());
}

std::optional<int64_t> SymDim::constant() const {
  if (terms_.empty()) return 0;
  if (is_constant()) return terms_.begin()->second;
  return std::nullopt;
}

bool SymDim::is_symbol() const {
  return terms_.size() == 1 && terms_.begin()->first.size() == 1 && terms_.begin()->second == 1;
}

std::optional<int64_t> SymDim::evaluate(const std::map<std::string, int64_t>& bindings) const {
  int64_t total = 0;
  for (const auto& [mono, coef] : terms_) {
    int64_t v = coef;
    for (const auto& s : mono) {
      auto it = bindings.find(s);
      if (it == bindings.end()) return std::nullopt;
      v *= it->second;
    }
    total += v;
  }
  return total;
}

std::string SymDim::to_string() const {
  if (terms_.empty()) return "0";
  std::string out;
  // Constants last reads naturally: "seq + 1".
  auto emit = [&](const Monomial& mono, int64_t coef) {
    if (!out.empty())
      out += coef < 0 ? " - " : " + ";
    else if (coef < 0)
      out += "-";
    int64_t a = coef < 0 ? -coef : coef;
    std::string m;
    for (const auto& s : mono) m += (m.empty() ? "" : "*") + s;
    if (m.empty())
      out += std::to_string(a);
    else if (a == 1)
      out += m;
    else
      out += std::to_string(a) + "*" + m;
  };
  for (const auto& [mono, coef] : terms_)
    if (!mono.empty()) emit(mono, coef);
  auto c = terms_.find({});
  if (c != terms_.end()) emit(c->first, c->second);
  return out;
}

void SymDim::add_term(const Monomial& m, int64_t coef) {
  auto& slot = terms_[m];
  slot += coef;
  if (slot == 0) terms_.erase(m);
}

SymDim SymDim::operator+(const SymDim& o) const {
  SymDim r = *this;
  for (const auto& [m, c] : o.terms_) r.add_term(m, c);
  return r;
}

SymDim SymDim::operator-(const SymDim& o) const {
  SymDim r = *this;
  for (const auto& [m, c] : o.terms_) r.add_term(m, -c);
  return r;
}

SymDim SymDim::operator*(const SymDim& o) const {
  SymDim r;
  for (const auto& [m1, c1] : terms_)
    for (const auto& [m2, c2] : o.terms_) {
      Monomial m = m1;
      m.insert(m.end(), m2.begin(), m2.end());
      std::sort(m.begin(), m.end());
      r.add_term(m, c1 * c2);
    }
  return r;
}

std::optional<SymDim> SymDim::exact_div(const SymDim& o) const {
  if (o.terms_.size() != 1) {
    if (*this == o) return SymDim(1);
    return std::nullopt;
  }
  const auto& [dm, dc] = *o.terms_.begin();
  if (dc == 0) return std::nullopt;
  SymDim r;
  for (const auto& [m, c] : terms_) {
    if (c % dc != 0) return std::nullopt;
    Monomial rest = m;
    for (const auto& s : dm) {
      auto it = std::find(rest.begin(), rest.end(), s);
      if (it == rest.end()) return std::nullopt;
      rest.erase(it);
    }
    r.add_term(rest, c / dc);
  }
  return r;
}

std::vector<std::string> SymDim::symbols() const {
  std::vector<std::string> out;
  for (const auto& [m, c] : terms_)
    for (const auto& s : m)
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

std::string sym_shape_to_string(const SymShape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + shape[i].to_string();
  return out + "]";
}

}  // namespace graphtrain
