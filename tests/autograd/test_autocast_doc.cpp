// The autocast policy table has one source, autograd/autocast_policy.cpp; docs/numerics.md
// carries the documented copy. This test reads that copy and checks it against the code's
// table: every op the code names sits in the doc row of its policy, and the doc names no op
// the code does not.
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "tests/test_util.h"

#ifndef MT_SOURCE_DIR
#error "MT_SOURCE_DIR (the repository root) must be defined for this test"
#endif

namespace mt {
namespace {

using autocast::CastPolicy;

constexpr const char* kDoc = MT_SOURCE_DIR "/docs/numerics.md";
// The line that precedes the table in the doc.
constexpr const char* kMarker = "<!-- autocast-policy-table -->";

// The words between backticks in `text`, in order.
std::vector<std::string> backticked(const std::string& text) {
  std::vector<std::string> words;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find('`', pos);
    if (open == std::string::npos) break;
    const size_t close = text.find('`', open + 1);
    if (close == std::string::npos) break;
    words.push_back(text.substr(open + 1, close - open - 1));
    pos = close + 1;
  }
  return words;
}

// The cells of a Markdown table row "| a | b |": {"a", "b"}, trimmed.
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream in(row);
  std::string cell;
  while (std::getline(in, cell, '|')) {
    const size_t first = cell.find_first_not_of(" \t");
    out.push_back(first == std::string::npos ? "" : cell.substr(first, cell.find_last_not_of(" \t") - first + 1));
  }
  if (!out.empty() && out.front().empty()) out.erase(out.begin());
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

const std::map<std::string, CastPolicy>& policies_by_name() {
  static const std::map<std::string, CastPolicy> names = {{"lower_precision", CastPolicy::lower_precision},
                                                          {"fp32", CastPolicy::fp32},
                                                          {"promote", CastPolicy::promote},
                                                          {"none", CastPolicy::none}};
  return names;
}

std::string name_of(CastPolicy policy) {
  for (const auto& [name, p] : policies_by_name()) {
    if (p == policy) return name;
  }
  return "?";
}

// Policy -> ops, as the doc's table gives them. The first column holds the policy's enum
// name in backticks, the last the ops in backticks.
std::map<CastPolicy, std::set<std::string>> documented_table(std::string* error) {
  std::ifstream file(kDoc);
  if (!file) {
    *error = std::string("cannot open ") + kDoc;
    return {};
  }
  std::map<CastPolicy, std::set<std::string>> table;
  std::set<std::string> seen_ops;
  std::string line;
  bool found_marker = false;
  while (std::getline(file, line)) {
    if (line.find(kMarker) != std::string::npos) {
      found_marker = true;
      break;
    }
  }
  if (!found_marker) {
    *error = std::string(kDoc) + ": no line " + kMarker + " before the autocast table";
    return {};
  }
  int row_number = 0;
  while (std::getline(file, line) && !line.empty() && line[0] == '|') {
    if (++row_number <= 2) continue;  // the header and the |---| line
    const std::vector<std::string> row = cells(line);
    if (row.size() < 2) {
      *error = "malformed row: " + line;
      return {};
    }
    const std::vector<std::string> policy_words = backticked(row.front());
    if (policy_words.size() != 1 || !policies_by_name().count(policy_words[0])) {
      *error = "the first cell must name one policy (`lower_precision`, `fp32`, `promote` or `none`): " + line;
      return {};
    }
    const CastPolicy policy = policies_by_name().at(policy_words[0]);
    if (table.count(policy)) {
      *error = "policy `" + policy_words[0] + "` has two rows";
      return {};
    }
    std::set<std::string>& ops = table[policy];
    for (const std::string& op : backticked(row.back())) {
      if (!seen_ops.insert(op).second) {
        *error = "op `" + op + "` appears twice in the table";
        return {};
      }
      ops.insert(op);
    }
  }
  if (table.empty()) *error = std::string(kDoc) + ": no table rows after " + kMarker;
  return table;
}

TEST(AutocastDoc, NumericsMdTableIsThePolicyTheCodeHolds) {
  std::string error;
  const std::map<CastPolicy, std::set<std::string>> doc = documented_table(&error);
  ASSERT_TRUE(error.empty()) << error;

  std::map<CastPolicy, std::set<std::string>> code;
  for (const auto& [op, policy] : autocast::policy_table()) code[policy].insert(op);

  for (const auto& [name, policy] : policies_by_name()) {
    const std::set<std::string> in_doc = doc.count(policy) ? doc.at(policy) : std::set<std::string>{};
    const std::set<std::string> in_code = code.count(policy) ? code.at(policy) : std::set<std::string>{};
    EXPECT_TRUE(doc.count(policy)) << "docs/numerics.md has no row for policy `" << name << "`";
    for (const std::string& op : in_code) {
      EXPECT_TRUE(in_doc.count(op)) << "autograd/autocast_policy.cpp gives `" << op << "` the policy `" << name
                                    << "`, but docs/numerics.md does not list it in that row";
    }
    for (const std::string& op : in_doc) {
      EXPECT_TRUE(in_code.count(op)) << "docs/numerics.md lists `" << op << "` under `" << name
                                     << "`, but autograd/autocast_policy.cpp gives it the policy `"
                                     << name_of(autocast::policy_for(op.c_str())) << "`";
    }
  }
}

}  // namespace
}  // namespace mt
