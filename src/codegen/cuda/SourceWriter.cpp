#include "codegen/cuda/SourceWriter.h"

#include <flexjit/error.h>

#include <fmt/format.h>

namespace flexjit::cuda {

void SourceWriter::line(std::string_view text) {
  if (!text.empty()) out_.append(static_cast<size_t>(depth_ * indent_width_), ' ');
  out_.append(text);
  out_ += '\n';
}

void SourceWriter::raw(std::string_view text) {
  out_.append(text);
  if (!text.empty() && text.back() != '\n') out_ += '\n';
}

SourceWriter::Indent::Indent(SourceWriter& w) : w_(w) {
  ++w_.depth_;
}

SourceWriter::Indent::~Indent() {
  w_.pop_scope();
}

void SourceWriter::pop_scope() {
  FJ_ASSERT(depth_ > 0, "SourceWriter: unbalanced indentation");
  --depth_;
  std::erase_if(temps_, [&](const auto& kv) { return kv.second.depth > depth_; });
  // With no temporary in scope (between functions) names restart at t0, so that a change to
  // one function does not renumber the next one.
  if (temps_.empty()) next_temp_ = 0;
}

// indent_ is constructed after the header line is written (members initialise in order).
SourceWriter::Block::Block(SourceWriter& w, std::string_view header, std::string closer)
    : w_((w.line(std::string(header) + " {"), w)), closer_(std::move(closer)), indent_(w) {}

SourceWriter::Block::~Block() {
  // indent_ is destroyed only after this body, so the brace is written one level out by hand.
  const int saved = w_.depth_;
  w_.depth_ = saved - 1;
  w_.line("}" + closer_);
  w_.depth_ = saved;
}

std::string SourceWriter::ssa(std::string_view type, std::string_view rhs) {
  std::string key = std::string(type) + "\n" + std::string(rhs);
  if (auto it = temps_.find(key); it != temps_.end()) return it->second.name;
  std::string name = fmt::format("t{}", next_temp_++);
  line(fmt::format("const {} {} = {};", type, name, rhs));
  temps_.emplace(std::move(key), Temp{name, depth_});
  return name;
}

}  // namespace flexjit::cuda
