// A separated list's items, for the parsers of comma-separated options (precision.fp8_layers,
// plan --overlap): every item in order, empty ones kept ("a,,b" -> a, "", b; "" -> one empty
// item), so that the parser refuses them by name rather than skipping them.
#pragma once
#include <string>
#include <vector>

namespace pt {

inline std::vector<std::string> split_list(const std::string& text, char sep = ',') {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    items.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return items;
    start = end + 1;
  }
}

}  // namespace pt
