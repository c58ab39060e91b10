// printf-style formatting into a std::string, for the report and plan tables (the project keeps
// to C++20's standard library, which has no std::format in g++ 12).
#pragma once
#include <cstdio>
#include <string>

namespace pt {

template <class... A>
std::string format(const char* fmt, A... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::snprintf(out.data(), out.size() + 1, fmt, args...);
  return out;
}

}  // namespace pt
