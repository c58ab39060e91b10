// README.md cannot drift from the code silently. It says what is still missing in one place, the
// "Still open" list of its Status section; next to it a table names each capability that works
// (its key words in **bold**) with the tests that prove it. Checked here:
//  - every test the table names exists (test/<name>.cpp or .sh), and each row has a bold word;
//  - a claim that something is missing ("not yet", "has not", ...) outside "Still open" fails;
//  - an item of "Still open" that names a bold capability of the table fails: the table says it
//    works, so the item contradicts it (how README once said in its first paragraph that tensor,
//    sequence and context parallelism were "not yet wired into the trainer" while they trained).
// Code blocks are skipped: they show program output ("step 51 has not finished").
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kMissingClaims = {"not yet", "has not", "have not", "not wired", "to come",
                                                 "not built", "has never", "have never", "yet to"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The README's lines outside ``` fences.
std::vector<std::string> prose_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  bool code = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      code = !code;
      continue;
    }
    out.push_back(code ? "" : line);  // keep the numbering
  }
  return out;
}

struct Capability {
  std::vector<std::string> words;  // the bold ones
  std::vector<std::string> tests;  // the backticked names of the "Proven by" cell
};

// What is wrong with README's claims (empty: nothing). `test_exists` says whether a named test is real.
template <class TestExists>
std::vector<std::string> readme_drift(const std::string& text, TestExists test_exists) {
  std::vector<std::string> problems;
  const std::vector<std::string> lines = prose_lines(text);
  size_t status = lines.size(), open = lines.size(), status_end = lines.size();
  for (size_t i = 0; i < lines.size(); i++) {
    if (lines[i] == "## Status") status = i;
    else if (status < i && open == lines.size() && lines[i].rfind("Still open", 0) == 0) open = i;
    else if (status < i && status_end == lines.size() && lines[i].rfind("## ", 0) == 0) status_end = i;
  }
  if (status == lines.size() || open == lines.size()) return {"README has no \"## Status\" with a \"Still open\" list"};

  std::vector<Capability> table;
  const std::regex bold(R"(\*\*([^*]+)\*\*)"), code(R"(`([^`]+)`)");
  for (size_t i = status; i < open; i++) {
    const std::string& l = lines[i];
    if (l.rfind("| ", 0) != 0 || l.rfind("| Capability", 0) == 0) continue;
    const size_t split = l.rfind(" | ");
    if (split == std::string::npos) continue;
    Capability c;
    const std::string what = l.substr(0, split), proof = l.substr(split);
    for (std::sregex_iterator m(what.begin(), what.end(), bold), e; m != e; ++m) c.words.push_back(lower((*m)[1]));
    for (std::sregex_iterator m(proof.begin(), proof.end(), code), e; m != e; ++m) c.tests.push_back((*m)[1]);
    if (c.tests.empty()) problems.push_back("Status row names no test: " + l);
    for (const auto& t : c.tests)
      if (!test_exists(t)) problems.push_back("Status names test `" + t + "`, which does not exist");
    table.push_back(c);
  }
  if (table.empty()) problems.push_back("Status has no table of what works");

  // "Still open": its items, each a "- " line and its continuation lines.
  std::vector<std::string> items;
  for (size_t i = open + 1; i < status_end; i++) {
    if (lines[i].rfind("- ", 0) == 0) items.push_back(lines[i]);
    else if (!items.empty() && !lines[i].empty()) items.back() += " " + lines[i];
  }
  for (const std::string& item : items) {
    const std::string l = lower(item);
    for (const Capability& c : table)
      for (const std::string& w : c.words)
        if (l.find(w) != std::string::npos)
          problems.push_back("\"Still open\" names \"" + w + "\", which Status says works: " + item);
  }
  for (size_t i = 0; i < lines.size(); i++) {
    if (i > open && i < status_end) continue;
    const std::string l = lower(lines[i]);
    for (const std::string& claim : kMissingClaims)
      if (l.find(claim) != std::string::npos)
        problems.push_back("line " + std::to_string(i + 1) + " says \"" + claim +
                           "\" outside Status' \"Still open\": " + lines[i]);
  }
  return problems;
}

std::string read_readme() {
  std::ifstream in(std::string(PICOTRAIN_SOURCE_DIR) + "/README.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_test(const std::string& name) {
  const fs::path dir = fs::path(PICOTRAIN_SOURCE_DIR) / "test";
  return fs::exists(dir / (name + ".cpp")) || fs::exists(dir / (name + ".sh"));
}

const char* kSmallReadme = R"(# x
Tensor, sequence and context parallelism exist as building blocks NOT_WIRED_CLAIM.

```
step 51 has not finished
```

## Status

| Capability | Proven by |
|---|---|
| **Tensor parallel** | `mpi_tensor_parallel` |

Still open (each is an issue):
- the CUDA backend has not run on a GPU;
- OPEN_ITEM

## Next
)";

std::string small_readme(const std::string& claim, const std::string& open_item) {
  std::string s = kSmallReadme;
  s.replace(s.find("NOT_WIRED_CLAIM"), 15, claim);
  s.replace(s.find("OPEN_ITEM"), 9, open_item);
  return s;
}

}  // namespace

TEST_CASE("README's claims agree with the tests", "[readme]") {
  const std::vector<std::string> problems = readme_drift(read_readme(), is_test);
  for (const auto& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
}

TEST_CASE("the README check catches each kind of drift", "[readme]") {
  // A README that agrees: the negative claim in the code block and the GPU item are allowed.
  CHECK(readme_drift(small_readme("in core/parallel/", "mixture of experts"), is_test).empty());
  // The first paragraph that once contradicted the Status section.
  const auto wired = readme_drift(small_readme("not yet wired into the trainer", "mixture of experts"), is_test);
  REQUIRE(wired.size() == 1);
  CHECK_THAT(wired[0], Catch::Matchers::Contains("line 2 says \"not yet\""));
  // An open item that names what the table says works.
  const auto open = readme_drift(small_readme("in core/parallel/", "tensor parallel with 3 ranks"), is_test);
  REQUIRE(open.size() == 1);
  CHECK_THAT(open[0], Catch::Matchers::Contains("names \"tensor parallel\""));
  // A table row whose test is gone.
  const auto gone = readme_drift(small_readme("in core/parallel/", "moe"), [](const std::string&) { return false; });
  REQUIRE(gone.size() == 1);
  CHECK_THAT(gone[0], Catch::Matchers::Contains("`mpi_tensor_parallel`, which does not exist"));
}
