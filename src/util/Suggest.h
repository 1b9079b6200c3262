// "Did you mean" for names a user types: standard mod names, CLI subcommands and flags, CUDA
// archs, and the .fx parser's identifiers, keywords and types (src/dsl/Parser.cpp). The rule: the
// closest candidate within an edit distance of a third of the name (at least 1), a transposition
// counting as one edit, else a candidate the name is a prefix of, else none.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit {

// The closest candidate to `name`, or nullopt when none is close. Case is ignored ("SM_90A"
// matches "sm_90a"), and so are '_' and '-' when nothing closer matches ("sm90a": "sm_90a").
std::optional<std::string> closest_match(std::string_view name,
                                         const std::vector<std::string>& candidates);

// " (did you mean 'causal'?)" for closest_match, or "" when none is close.
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace flexjit
