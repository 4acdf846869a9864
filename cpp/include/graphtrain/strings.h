// Small string helpers that keep <sstream> out of every translation unit.
#pragma once

#include <charconv>
#include <concepts>
#include <string>
#include <string_view>
#include <vector>

namespace graphtrain {
namespace detail {

inline void append(std::string& out, std::string_view s) {
  out.append(s);
}
inline void append(std::string& out, const char* s) {
  out.append(s ? s : "(null)");
}
inline void append(std::string& out, char c) {
  out.push_back(c);
}
inline void append(std::string& out, bool b) {
  out.append(b ? "true" : "false");
}

template <typename T>
requires(std::integral<T> && !std::same_as<T, bool> &&
         !std::same_as<T, char>) void append(std::string& out, T v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, res.ptr);
}

template <std::floating_point T>
void append(std::string& out, T v) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, res.ptr);
}

template <typename T>
void append(std::string& out, const std::vector<T>& items) {
  out.push_back('[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out.append(", ");
    append(out, items[i]);
  }
  out.push_back(']');
}

}  // namespace detail

// Concatenates strings, characters, numbers and vectors of them into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::string out;
  (detail::append(out, args), ...);
  return out;
}

}  // namespace graphtrain
