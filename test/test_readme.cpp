// README.md and the guides in docs/ cannot drift from the code silently. README says what is still
// missing in one place, the "Still open" list of its Status section; next to it a table names each
// capability that works (its key words in **bold**) with the tests that prove it. Checked here:
//  - every test the table names exists (test/<name>.cpp or .sh), and each row has a bold word;
//  - a claim that something is missing ("not yet", "has not", ...) outside "Still open" fails, in
//    README.md and in every docs/*.md (the text that moved there from README is held to the same rule);
//  - an item of "Still open" that names a bold capability of the table fails: the table says it
//    works, so the item contradicts it (how README once said in its first paragraph that tensor,
//    sequence and context parallelism were "not yet wired into the trainer" while they trained);
//  - docs/log.md's table of metrics.jsonl fields names every field the metrics log writes (a
//    record with every optional field set), and its rows name no field that is not written;
//  - the guides are reachable: README links every docs/*.md, each guide opens with a "# " title and
//    a paragraph that links back to README, and every relative link of README and the guides names
//    a file that exists and, with a #fragment, a heading of that file (GitHub's anchors).
// Code blocks are skipped: they show program output ("step 51 has not finished").
#include <catch2/catch.hpp>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/metrics/metrics_log.h"

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

// Every line of `lines` outside [skip_begin, skip_end) that claims something is missing.
std::vector<std::string> missing_claims(const std::vector<std::string>& lines, size_t skip_begin, size_t skip_end) {
  std::vector<std::string> problems;
  for (size_t i = 0; i < lines.size(); i++) {
    if (i >= skip_begin && i < skip_end) continue;
    const std::string l = lower(lines[i]);
    for (const std::string& claim : kMissingClaims)
      if (l.find(claim) != std::string::npos)
        problems.push_back("line " + std::to_string(i + 1) + " says \"" + claim +
                           "\" outside Status' \"Still open\": " + lines[i]);
  }
  return problems;
}

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
  for (std::string& p : missing_claims(lines, open + 1, status_end)) problems.push_back(std::move(p));
  return problems;
}

// A guide's claims that something is missing: a guide has no "Still open" of its own, so every
// such claim fails, named by the file (`name`) and its line.
std::vector<std::string> guide_drift(const std::string& name, const std::string& text) {
  std::vector<std::string> problems;
  for (const std::string& p : missing_claims(prose_lines(text), 0, 0)) problems.push_back(name + ": " + p);
  return problems;
}

// The anchor GitHub gives a heading: lower case, every character but letters, digits, '-', '_' and
// spaces dropped (so backticks and colons go), spaces turned into '-'.
std::string github_anchor(const std::string& heading) {
  std::string out;
  for (unsigned char c : lower(heading))
    if (std::isalnum(c) || c == '-' || c == '_' || c >= 0x80) out += static_cast<char>(c);
    else if (c == ' ') out += '-';
  return out;
}

// The anchors of a markdown file's headings (outside code blocks), a repeated one numbered as
// GitHub numbers it (x, x-1, x-2, ...).
std::set<std::string> heading_anchors(const std::string& text) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  for (const std::string& line : prose_lines(text)) {
    const size_t hashes = line.find_first_not_of('#');
    if (hashes == 0 || hashes == std::string::npos || line[hashes] != ' ') continue;
    const std::string a = github_anchor(line.substr(hashes + 1));
    const int n = seen[a]++;
    anchors.insert(n == 0 ? a : a + "-" + std::to_string(n));
  }
  return anchors;
}

// The relative link targets of a markdown file (`[text](target)` outside code blocks; web
// addresses left out), with the line each is on.
std::vector<std::pair<size_t, std::string>> relative_links(const std::string& text) {
  std::vector<std::pair<size_t, std::string>> links;
  const std::regex link(R"(\]\(([^)\s]+)\))");
  const std::vector<std::string> lines = prose_lines(text);
  for (size_t i = 0; i < lines.size(); i++)
    for (std::sregex_iterator m(lines[i].begin(), lines[i].end(), link), e; m != e; ++m) {
      const std::string target = (*m)[1];
      if (target.find("://") == std::string::npos && target.rfind("mailto:", 0) != 0) links.emplace_back(i + 1, target);
    }
  return links;
}

// The text of a file by its path from the repository root; nullopt when there is none.
using ReadFile = std::function<std::optional<std::string>(const std::string&)>;

// What is wrong with the links of the file `from` (a path from the repository root): each
// relative link names a file that exists and, with a #fragment, a heading of it.
std::vector<std::string> link_drift(const std::string& from, const std::string& text, const ReadFile& read) {
  std::vector<std::string> problems;
  for (const auto& [line, target] : relative_links(text)) {
    const size_t hash = target.find('#');
    const std::string file = target.substr(0, hash);
    const std::string path = file.empty() ? from : (fs::path(from).parent_path() / file).lexically_normal().generic_string();
    const std::string where = from + " line " + std::to_string(line) + ": link " + target;
    const std::optional<std::string> linked = file.empty() ? std::optional<std::string>(text) : read(path);
    if (!linked) {
      problems.push_back(where + " names " + path + ", which does not exist");
      continue;
    }
    if (hash == std::string::npos || !path.ends_with(".md")) continue;
    const std::string anchor = target.substr(hash + 1);
    if (!heading_anchors(*linked).contains(anchor))
      problems.push_back(where + ": " + path + " has no heading whose anchor is #" + anchor);
  }
  return problems;
}

// What is wrong with how the guides hang together: README links each guide (`guides`: names
// under docs/), and each guide opens with a "# " title and a paragraph that links back to README.
std::vector<std::string> guides_drift(const std::string& readme, const std::vector<std::string>& guides,
                                      const ReadFile& read) {
  std::vector<std::string> problems;
  std::set<std::string> linked;
  for (const auto& [line, target] : relative_links(readme)) linked.insert(target.substr(0, target.find('#')));
  for (const std::string& g : guides) {
    const std::string path = "docs/" + g;
    if (!linked.contains(path)) problems.push_back("README links no " + path + ": a guide a reader cannot reach");
    const std::optional<std::string> text = read(path);
    if (!text) {
      problems.push_back(path + " cannot be read");
      continue;
    }
    std::istringstream in(*text);
    std::string title, line, opening;
    std::getline(in, title);
    if (title.rfind("# ", 0) != 0) problems.push_back(path + " does not open with a \"# \" title");
    std::getline(in, line);  // the blank line after the title
    while (std::getline(in, line) && !line.empty()) opening += line + "\n";
    if (opening.find("](../README.md") == std::string::npos)
      problems.push_back(path + "'s opening paragraph (what it covers) does not link back to ../README.md");
  }
  return problems;
}

std::optional<std::string> read_source(const std::string& path) {
  std::ifstream in(fs::path(PICOTRAIN_SOURCE_DIR) / path);
  if (!in.good() || fs::is_directory(fs::path(PICOTRAIN_SOURCE_DIR) / path)) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_readme() {
  const std::optional<std::string> text = read_source("README.md");
  REQUIRE(text);
  return *text;
}

// The guides: every docs/*.md, by name, sorted.
std::vector<std::string> guide_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(PICOTRAIN_SOURCE_DIR) / "docs"))
    if (e.path().extension() == ".md") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
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

TEST_CASE("the guides in docs/ claim nothing missing, are reachable and their links resolve", "[readme]") {
  const std::vector<std::string> guides = guide_names();
  CHECK(guides.size() >= 9);  // running, multi-rank, parallel, checkpoints, reliability, log, models, gpu, configuration
  std::vector<std::string> problems = guides_drift(read_readme(), guides, read_source);
  for (const std::string& p : link_drift("README.md", read_readme(), read_source)) problems.push_back(p);
  for (const std::string& g : guides) {
    const std::string text = read_source("docs/" + g).value_or("");
    for (const std::string& p : guide_drift("docs/" + g, text)) problems.push_back(p);
    for (const std::string& p : link_drift("docs/" + g, text, read_source)) problems.push_back(p);
  }
  for (const auto& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
}

TEST_CASE("docs/log.md's metrics table names every field of metrics.jsonl, and no other", "[readme]") {
  // A record with every optional field present, as MetricsLog writes it.
  const fs::path dir = fs::temp_directory_path() / "picotrain_test_readme_metrics";
  fs::create_directories(dir);
  pt::StepMetrics m;
  m.step = m.total_steps = 1;
  m.phases = pt::PhaseTimes{};
  m.val_loss = m.pp_bubble = m.pp_wait_ms = m.moe_aux = m.moe_max_load = m.mfu_fp8 = 1.0;
  m.task = pt::TaskAccuracy{"hellaswag", 0.5, 0.5};
  m.skipped_steps = 1;
  { pt::MetricsLog((dir / "metrics.jsonl").string(), "palm").log(m); }
  std::ifstream in(dir / "metrics.jsonl");
  std::string record;
  REQUIRE(std::getline(in, record));
  std::set<std::string> written;
  const nlohmann::json fields = nlohmann::json::parse(record);
  for (const auto& [field, value] : fields.items()) written.insert(field);
  fs::remove_all(dir);

  // The "## The metrics file" section of docs/log.md: every `name` in it, and those in its rows' first cells.
  const std::vector<std::string> lines = prose_lines(read_source("docs/log.md").value_or(""));
  auto begin = std::find(lines.begin(), lines.end(), "## The metrics file");
  REQUIRE(begin != lines.end());
  auto end = std::find_if(begin + 1, lines.end(), [](const std::string& l) { return l.rfind("## ", 0) == 0; });
  std::set<std::string> named, in_rows;
  const std::regex code(R"(`([a-z_0-9]+)`)");
  for (auto l = begin; l != end; ++l) {
    for (std::sregex_iterator c(l->begin(), l->end(), code), e; c != e; ++c) named.insert((*c)[1]);
    if (l->rfind("| `", 0) != 0) continue;
    const std::string first = l->substr(0, l->find(" | "));
    for (std::sregex_iterator c(first.begin(), first.end(), code), e; c != e; ++c) in_rows.insert((*c)[1]);
  }
  CHECK(written.size() >= 20);
  for (const std::string& f : written) {
    INFO("metrics.jsonl field " << f << " is not named in docs/log.md's \"The metrics file\"");
    CHECK(named.contains(f));
  }
  for (const std::string& f : in_rows) {
    INFO("docs/log.md's metrics table has a row for " << f << ", which metrics.jsonl does not write");
    CHECK(written.contains(f));
  }
}

TEST_CASE("the guide checks catch each kind of drift", "[readme]") {
  std::map<std::string, std::string> files = {
      {"README.md", "# x\nSee [the guide](docs/a.md#the-plan-picotrain-plan) and [b](docs/b.md).\n"},
      {"docs/a.md", "# A\n\nWhat A covers. [Back](../README.md).\n\n## The plan: `picotrain plan`\n\n"
                    "```\n## not a heading\n```\n## Twice\n## Twice\n"},
      {"docs/b.md", "# B\n\nWhat B covers. [Back](../README.md).\n"}};
  const ReadFile read = [&](const std::string& p) -> std::optional<std::string> {
    auto it = files.find(p);
    return it == files.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  CHECK(github_anchor("Planning a layout: `picotrain plan`") == "planning-a-layout-picotrain-plan");
  CHECK(heading_anchors(files["docs/a.md"]) == std::set<std::string>{"a", "the-plan-picotrain-plan", "twice", "twice-1"});
  CHECK(guides_drift(files["README.md"], {"a.md", "b.md"}, read).empty());
  CHECK(link_drift("README.md", files["README.md"], read).empty());
  CHECK(link_drift("docs/a.md", files["docs/a.md"] + "[up](../README.md) [here](#twice-1) [web](https://x.org/#none)\n", read)
            .empty());
  // A link to a file that is not there, and to a heading that is not there.
  const auto gone = link_drift("docs/a.md", "x\n[c](c.md) [plan](a.md#planning)", read);
  REQUIRE(gone.size() == 2);
  CHECK_THAT(gone[0], Catch::Matchers::Contains("docs/a.md line 2: link c.md names docs/c.md, which does not exist"));
  CHECK_THAT(gone[1], Catch::Matchers::Contains("docs/a.md has no heading whose anchor is #planning"));
  // A heading inside a code block is no anchor.
  CHECK(link_drift("docs/b.md", "[x](a.md#not-a-heading)", read).size() == 1);
  // A guide README does not link, and one that does not link back.
  const auto unlinked = guides_drift("# x\n[a](docs/a.md)\n", {"a.md", "b.md"}, read);
  REQUIRE(unlinked.size() == 1);
  CHECK_THAT(unlinked[0], Catch::Matchers::Contains("README links no docs/b.md"));
  files["docs/b.md"] = "B\n\nWhat B covers.\n\nSee [Back](../README.md).\n";
  const auto lost = guides_drift(files["README.md"], {"b.md"}, read);
  REQUIRE(lost.size() == 2);
  CHECK_THAT(lost[0], Catch::Matchers::Contains("does not open with a \"# \" title"));
  CHECK_THAT(lost[1], Catch::Matchers::Contains("does not link back"));
  // A guide's claim that something is missing fails wherever it stands; in a code block it is output.
  const auto claim = guide_drift("docs/b.md", "# B\n\nRing attention is not yet overlapped.\n```\nhas not finished\n```\n");
  REQUIRE(claim.size() == 1);
  CHECK_THAT(claim[0], Catch::Matchers::Contains("docs/b.md: line 3 says \"not yet\""));
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
