// Checks for the numeric flags of every subcommand, with messages in words: the error reads
// "--gpus must be >= 1, got 0" (main drops CLI11's ':' after the flag), where CLI11's own range
// checks print "Value 0 not in range 0.000000 to 1797693134862315708..." (DBL_MAX in full).
// The check runs on the text before CLI11 converts it, so "abc" and "1.5" for a whole number get
// the same kind of message. The description is what `--help` shows after the type.
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>

namespace pt::cli {

struct NumberRule {
  bool whole = false;                // an integer
  double min = -HUGE_VAL;            // the lowest value allowed
  bool min_inclusive = true;         // >= min (else > min)
  double max = HUGE_VAL;             // the highest value allowed (inclusive)
  std::string meaning;               // said after the rule, e.g. "0: greedy"
};

inline std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// The rule in words: ">= 1", "> 0", "between 0 and 0.5", "> 0 and <= 1".
inline std::string describe(const NumberRule& r) {
  std::string s;
  if (std::isfinite(r.min) && std::isfinite(r.max))
    s = r.min_inclusive ? "between " + number_text(r.min) + " and " + number_text(r.max)
                        : "> " + number_text(r.min) + " and <= " + number_text(r.max);
  else if (std::isfinite(r.min)) s = (r.min_inclusive ? ">= " : "> ") + number_text(r.min);
  else if (std::isfinite(r.max)) s = "<= " + number_text(r.max);
  return s;
}

inline CLI::Validator number(const NumberRule& r) {
  const std::string rule = describe(r);
  const std::string kind = r.whole ? "a whole number" : "a number";
  return CLI::Validator(
      [r, rule, kind](std::string& v) -> std::string {
        const std::string said = r.meaning.empty() ? "" : " (" + r.meaning + ")";
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        const bool parsed = !v.empty() && *end == '\0' && std::isfinite(x);
        // A whole number is digits (CLI11 converts it with strtoll: "1e3" and "2.0" would fail there).
        const bool digits = v.find_first_not_of("0123456789", v[0] == '-' || v[0] == '+' ? 1 : 0) == std::string::npos;
        if (!parsed || (r.whole && !digits))
          return "must be " + kind + (rule.empty() ? "" : " " + rule) + ", got '" + v + "'";
        const bool low = r.min_inclusive ? x < r.min : x <= r.min;
        if (low || x > r.max) return "must be " + rule + ", got " + v + said;
        return {};
      },
      rule.empty() ? "" : rule);
}

inline CLI::Validator whole_at_least(double min, std::string meaning = "") {
  return number({.whole = true, .min = min, .meaning = std::move(meaning)});
}
inline CLI::Validator at_least(double min, std::string meaning = "") {
  return number({.min = min, .meaning = std::move(meaning)});
}
inline CLI::Validator above(double min) { return number({.min = min, .min_inclusive = false}); }
inline CLI::Validator between(double lo, double hi) { return number({.min = lo, .max = hi}); }
inline CLI::Validator above_up_to(double lo, double hi) { return number({.min = lo, .min_inclusive = false, .max = hi}); }

// CLI11 writes a failed check as "--gpus: must be >= 1, got 0"; the user reads "--gpus must be
// >= 1, got 0".
inline std::string words_for(const CLI::ParseError& e) {
  std::string msg = e.what();
  if (dynamic_cast<const CLI::ValidationError*>(&e)) {
    const size_t at = msg.find(": must be ");
    if (at != std::string::npos && msg.find(' ') > at) msg.erase(at, 1);
  }
  return msg;
}

}  // namespace pt::cli
