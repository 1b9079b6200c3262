#include <flexjit/error.h>

#include <fmt/format.h>

namespace flexjit {

namespace {
std::string format_diagnostic(const std::string& message, const SourceLoc& loc,
                              const std::string& source_line) {
  if (!loc.known()) return fmt::format("error: {}", message);
  std::string out = fmt::format("{}:{}:{}: error: {}", loc.file, loc.line, loc.col, message);
  if (!source_line.empty()) {
    out += fmt::format("\n  {}\n  {}^", source_line,
                       std::string(static_cast<size_t>(std::max(loc.col - 1, 0)), ' '));
  }
  return out;
}
}  // namespace

CompileError::CompileError(const std::string& message, SourceLoc loc,
                           const std::string& source_line)
    : Error(format_diagnostic(message, loc, source_line)),
      message_(message),
      loc_(std::move(loc)) {}

void throw_internal_error(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(
      fmt::format("flexjit internal error at {}:{}: {} ({}). This is a bug in flexjit.", file, line,
                  msg, cond));
}

}  // namespace flexjit
