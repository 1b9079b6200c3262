#include "jit/ResourceUsage.h"

#include <fmt/format.h>

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <regex>
#include <sstream>

namespace flexjit::jit {

std::string ResourceUsage::str() const {
  auto num = [](int v) { return v < 0 ? std::string("?") : std::to_string(v); };
  int spills = spill_store_bytes < 0 && spill_load_bytes < 0
                   ? -1
                   : std::max(spill_store_bytes, 0) + std::max(spill_load_bytes, 0);
  std::string out =
      fmt::format("{} registers, {} B spills, {} B stack, {} B static smem", num(registers),
                  num(spills), num(stack_frame_bytes), num(static_shared_bytes));
  if (!wgmma_serialized.empty()) out += fmt::format(", wgmma serialized ({})", wgmma_serialized);
  return out;
}

namespace {

std::optional<int> find_int(const std::string& line, const std::regex& re) {
  std::smatch m;
  if (!std::regex_search(line, m, re)) return std::nullopt;
  return std::stoi(m[1].str());
}

}  // namespace

// The log reads, per function (device functions that were not inlined appear too):
//   ptxas info    : Compiling entry function 'flexjit_forward' for 'sm_80'
//   ptxas info    : Function properties for flexjit_forward
//   ptxas         .     32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 243 registers, used 1 barriers, 4096 bytes smem, 624 bytes cmem[0]
// and, where ptxas gave up on asynchronous wgmma (CUDA 13.0's wording),
//   ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are
//   serialized due to insufficient register resources for the function 'flexjit_bwd_dkdv'
// (one line), which names its function itself.
ResourceUsage usage_from_ptxas_log(std::string_view log, std::string_view kernel) {
  static const std::regex kEntry(R"(Compiling entry function '([^']+)')");
  static const std::regex kProperties(R"(Function properties for (\S+))");
  static const std::regex kStack(R"((\d+) bytes stack frame)");
  static const std::regex kSpillStores(R"((\d+) bytes spill stores)");
  static const std::regex kSpillLoads(R"((\d+) bytes spill loads)");
  static const std::regex kRegisters(R"(Used (\d+) registers)");
  static const std::regex kSmem(R"((\d+) bytes smem)");
  static const std::regex kSerialized(
      R"(\((C\d+)\)[^:]*: wgmma\.mma_async instructions are serialized(?: due to)? (.*?)(?: (?:for|in) (?:the )?function '([^']+)')?\s*$)");
  ResourceUsage u;
  std::string current;
  std::istringstream in{std::string(log)};
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, kSerialized)) {
      const std::string fn = m[3].matched ? m[3].str() : current;
      if (fn == kernel) u.wgmma_serialized = fmt::format("{}: {}", m[1].str(), m[2].str());
      continue;
    }
    if (std::regex_search(line, m, kEntry) || std::regex_search(line, m, kProperties)) {
      current = m[1].str();
      continue;
    }
    if (current != kernel) continue;
    if (auto v = find_int(line, kStack)) u.stack_frame_bytes = *v;
    if (auto v = find_int(line, kSpillStores)) u.spill_store_bytes = *v;
    if (auto v = find_int(line, kSpillLoads)) u.spill_load_bytes = *v;
    if (auto v = find_int(line, kRegisters)) {
      u.registers = *v;
      // ptxas leaves out "N bytes smem" when the kernel has no static shared memory.
      u.static_shared_bytes = find_int(line, kSmem).value_or(0);
    }
  }
  return u;
}

namespace {

// A bounds-checked view of a 64-bit little-endian ELF (cubins are ELFCLASS64).
class ElfView {
 public:
  explicit ElfView(const std::vector<char>& bytes) : bytes_(bytes) {}

  bool valid() const {
    if (bytes_.size() < sizeof(Elf64_Ehdr)) return false;
    if (std::memcmp(bytes_.data(), ELFMAG, SELFMAG) != 0) return false;
    if (static_cast<unsigned char>(bytes_[EI_CLASS]) != ELFCLASS64) return false;
    Elf64_Ehdr h = header();
    if (h.e_machine != EM_CUDA || h.e_shentsize != sizeof(Elf64_Shdr)) return false;
    return in_bounds(h.e_shoff, uint64_t{h.e_shnum} * sizeof(Elf64_Shdr)) &&
           h.e_shstrndx < h.e_shnum;
  }
  Elf64_Ehdr header() const { return read<Elf64_Ehdr>(0); }
  int num_sections() const { return header().e_shnum; }
  Elf64_Shdr section(int i) const {
    return read<Elf64_Shdr>(header().e_shoff + uint64_t(i) * sizeof(Elf64_Shdr));
  }
  std::string section_name(int i) const {
    return string_at(section(header().e_shstrndx), section(i).sh_name);
  }
  std::string string_at(const Elf64_Shdr& strtab, uint64_t offset) const {
    if (offset >= strtab.sh_size || !in_bounds(strtab.sh_offset, strtab.sh_size)) return {};
    const char* start = bytes_.data() + strtab.sh_offset + offset;
    size_t max_len = strtab.sh_size - offset;
    return std::string(start, strnlen(start, max_len));
  }
  bool in_bounds(uint64_t offset, uint64_t size) const {
    return offset <= bytes_.size() && size <= bytes_.size() - offset;
  }
  template <typename T>
  T read(uint64_t offset) const {
    T out{};
    if (in_bounds(offset, sizeof(T))) std::memcpy(&out, bytes_.data() + offset, sizeof(T));
    return out;
  }

 private:
  const std::vector<char>& bytes_;
};

// .nv.info attribute encoding: a format byte, an attribute byte, then for EIFMT_SVAL a u16 size
// and that many bytes; the other formats carry a u16 inline.
constexpr uint8_t kEifmtSval = 0x04;
constexpr uint8_t kEiattrMaxThreads = 0x05;
constexpr uint8_t kEiattrFrameSize = 0x11;
constexpr uint8_t kEiattrRegcount = 0x2f;

template <typename Fn>
void for_each_attribute(const ElfView& elf, const Elf64_Shdr& s, Fn&& fn) {
  if (!elf.in_bounds(s.sh_offset, s.sh_size)) return;
  uint64_t off = s.sh_offset;
  uint64_t end = s.sh_offset + s.sh_size;
  while (off + 4 <= end) {
    uint8_t format = elf.read<uint8_t>(off);
    uint8_t attr = elf.read<uint8_t>(off + 1);
    uint16_t size = elf.read<uint16_t>(off + 2);
    if (format != kEifmtSval) {
      off += 4;
      continue;
    }
    if (off + 4 + size > end) return;
    fn(attr, off + 4, size);
    off += 4 + size;
  }
}

}  // namespace

ResourceUsage usage_from_cubin(const std::vector<char>& cubin, std::string_view kernel) {
  ResourceUsage u;
  ElfView elf(cubin);
  if (!elf.valid()) return u;
  // The kernel's symbol index: per-function attributes in the global .nv.info name it.
  int64_t symbol = -1;
  for (int i = 0; i < elf.num_sections() && symbol < 0; ++i) {
    Elf64_Shdr s = elf.section(i);
    if (s.sh_type != SHT_SYMTAB || s.sh_entsize != sizeof(Elf64_Sym)) continue;
    if (s.sh_link >= static_cast<uint32_t>(elf.num_sections())) continue;
    Elf64_Shdr strtab = elf.section(static_cast<int>(s.sh_link));
    for (uint64_t k = 0; k < s.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym = elf.read<Elf64_Sym>(s.sh_offset + k * sizeof(Elf64_Sym));
      if (elf.string_at(strtab, sym.st_name) == kernel) {
        symbol = static_cast<int64_t>(k);
        break;
      }
    }
  }
  if (symbol < 0) return u;
  const std::string own_info = ".nv.info." + std::string(kernel);
  for (int i = 0; i < elf.num_sections(); ++i) {
    std::string name = elf.section_name(i);
    Elf64_Shdr s = elf.section(i);
    if (name == ".nv.info") {
      for_each_attribute(elf, s, [&](uint8_t attr, uint64_t at, uint16_t size) {
        if (size != 8 || elf.read<uint32_t>(at) != static_cast<uint32_t>(symbol)) return;
        int value = static_cast<int>(elf.read<uint32_t>(at + 4));
        if (attr == kEiattrRegcount) u.registers = value;
        if (attr == kEiattrFrameSize) u.stack_frame_bytes = value;
      });
    } else if (name == own_info) {
      for_each_attribute(elf, s, [&](uint8_t attr, uint64_t at, uint16_t size) {
        if (attr != kEiattrMaxThreads || size != 12) return;
        u.max_threads_per_block = static_cast<int>(elf.read<uint32_t>(at)) *
                                  static_cast<int>(elf.read<uint32_t>(at + 4)) *
                                  static_cast<int>(elf.read<uint32_t>(at + 8));
      });
    }
  }
  return u;
}

int cubin_sm_version(const std::vector<char>& cubin) {
  ElfView elf(cubin);
  if (!elf.valid()) return -1;
  // CUDA ELF ABI v8 (CUDA 13) keeps the SM number in bits 8..15 of e_flags.
  return static_cast<int>((elf.header().e_flags >> 8) & 0xff);
}

}  // namespace flexjit::jit
