// Typed reading of FLEXJIT_* environment variables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flexjit::env {

// The variable's value; nullopt when it is unset or empty.
std::optional<std::string> get(const char* name);

// True for "1", "true", "yes", "on" (any case); false when unset, empty or anything else.
bool flag(const char* name);

// A non-negative integer; nullopt when unset. Throws flexjit::Error naming the variable when the
// value is not a number.
std::optional<uint64_t> get_u64(const char* name);

// A comma-separated list, items trimmed, empty items dropped.
std::vector<std::string> list(const char* name);

}  // namespace flexjit::env
