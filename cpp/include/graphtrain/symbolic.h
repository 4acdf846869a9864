// Symbolic dimensions: integer polynomials over named dims ("batch*seq", "seq + 1", "2*heads"),
// kept in a canonical form so that equal expressions compare equal.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace graphtrain {

class SymDim {
 public:
  SymDim() = default;     // the constant 0
  SymDim(int64_t value);  // NOLINT: constants convert implicitly
  static SymDim symbol(std::string name);
  // A new symbol no other dim equals: for dims nothing is known about.
  static SymDim fresh(std::string_view hint = "unk");
  // Parses "batch", "batch*seq", "seq+1", "2*heads*d", "12"; anything else becomes one symbol.
  static SymDim parse(std::string_view text);

  bool is_constant() const;
  std::optional<int64_t> constant() const;
  bool is_symbol() const;  // a single symbol with coefficient 1
  // Value given the symbols' values; nullopt if a symbol is unbound.
  std::optional<int64_t> evaluate(const std::map<std::string, int64_t>& bindings) const;
  std::string to_string() const;

  SymDim operator+(const SymDim& o) const;
  SymDim operator-(const SymDim& o) const;
  SymDim operator*(const SymDim& o) const;
  // this / o when the division is exact term by term (by a constant or a monomial).
  std::optional<SymDim> exact_div(const SymDim& o) const;
  bool operator==(const SymDim& o) const { return terms_ == o.terms_; }
  bool operator!=(const SymDim& o) const { return !(*this == o); }

  // Symbols appearing in this dim.
  std::vector<std::string> symbols() const;

 private:
  using Monomial = std::vector<std::string>;  // sorted symbol names, repeated for powers
  void add_term(const Monomial& m, int64_t coef);
  std::map<Monomial, int64_t> terms_;  // no zero coefficients
};

using SymShape = std::vector<SymDim>;
std::string sym_shape_to_string(const SymShape& shape);

}  // namespace graphtrain
