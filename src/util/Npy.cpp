#include "util/Npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/CheckedMath.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>

#include <unistd.h>
#include <stdexcept>

namespace flexjit::npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// The header (magic through the newline) is padded to a multiple of this for alignment.
constexpr size_t kHeaderAlign = 64;

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// The value text after `'key':` in the header dict; npy headers are Python literals that numpy
// writes in one fixed style, so a key scan suffices.
std::string_view find_value(std::string_view dict, std::string_view key, const std::string& name) {
  for (char quote : {'\'', '"'}) {
    std::string k = fmt::format("{}{}{}", quote, key, quote);
    size_t pos = dict.find(k);
    if (pos == std::string_view::npos) continue;
    pos = dict.find(':', pos + k.size());
    if (pos == std::string_view::npos) break;
    std::string_view rest = dict.substr(pos + 1);
    size_t start = rest.find_first_not_of(" \t");
    if (start == std::string_view::npos) break;
    return rest.substr(start);
  }
  throw Error(fmt::format("{}: malformed .npy header: no '{}' in {}", name, key, dict));
}

Header parse_header(std::string_view dict, const std::string& name) {
  Header h;
  std::string_view d = find_value(dict, "descr", name);
  if (d.empty() || (d[0] != '\'' && d[0] != '"')) {
    throw Error(
        fmt::format("{}: malformed .npy header: descr is not a string "
                    "(structured dtypes are not supported)",
                    name));
  }
  size_t end = d.find(d[0], 1);
  if (end == std::string_view::npos) throw Error(fmt::format("{}: malformed .npy header", name));
  h.descr = std::string(d.substr(1, end - 1));

  std::string_view f = find_value(dict, "fortran_order", name);
  if (f.starts_with("True")) {
    h.fortran_order = true;
  } else if (!f.starts_with("False")) {
    throw Error(fmt::format("{}: malformed .npy header: fortran_order is not True/False", name));
  }

  std::string_view s = find_value(dict, "shape", name);
  if (s.empty() || s[0] != '(') {
    throw Error(fmt::format("{}: malformed .npy header: shape is not a tuple", name));
  }
  size_t close = s.find(')');
  if (close == std::string_view::npos) {
    throw Error(fmt::format("{}: malformed .npy header: unterminated shape", name));
  }
  std::string_view items = s.substr(1, close - 1);
  size_t i = 0;
  while (i < items.size()) {
    while (i < items.size() && (items[i] == ' ' || items[i] == ','))
      ++i;
    if (i == items.size()) break;
    size_t j = i;
    while (j < items.size() && items[j] >= '0' && items[j] <= '9')
      ++j;
    if (j == i) {
      throw Error(fmt::format("{}: malformed .npy header: bad shape ({})", name, items));
    }
    const std::string digits(items.substr(i, j - i));
    errno = 0;
    const long long dim = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) {
      throw Error(
          fmt::format("{}: malformed .npy header: dimension {} is too large", name, digits));
    }
    h.shape.push_back(dim);
    i = j;
  }
  return h;
}

DType dtype_from_descr(std::string descr, const std::string& name) {
  if (!descr.empty() && descr[0] == '=') descr[0] = '<';  // native: little-endian hosts only
  if (descr == "<f4") return DType::F32;
  if (descr == "<f2") return DType::F16;
  if (descr == "<i4") return DType::I32;
  if (descr == "|b1" || descr == "|u1") return DType::Bool;
  if (descr == "<u2" || descr == "<V2" || descr == "|V2") return DType::BF16;
  throw Error(fmt::format(
      "{}: unsupported dtype '{}' (flexjit reads <f4 <f2 <i4 |b1 |u1, and bf16 as <u2 or <V2)",
      name, descr));
}

// Reorders Fortran-order elements (first index fastest) into C order.
std::vector<char> fortran_to_c(const char* src, const std::vector<int64_t>& shape, size_t elem,
                               int64_t numel) {
  std::vector<char> out(static_cast<size_t>(numel) * elem);
  const size_t nd = shape.size();
  std::vector<int64_t> fstride(nd);
  int64_t s = 1;
  for (size_t d = 0; d < nd; ++d) {
    fstride[d] = s;
    s *= shape[d];
  }
  std::vector<int64_t> idx(nd, 0);
  for (int64_t c = 0; c < numel; ++c) {
    int64_t f = 0;
    for (size_t d = 0; d < nd; ++d)
      f += idx[d] * fstride[d];
    std::memcpy(out.data() + c * elem, src + f * elem, elem);
    for (size_t d = nd; d-- > 0;) {  // C order: last index fastest
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace

int64_t Array::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

TensorRef Array::view() const {
  return TensorRef::contiguous(const_cast<char*>(bytes.data()), dtype, shape);
}

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// numel * dtype_size(dtype), or nullopt when an extent is negative or the count overflows.
std::optional<int64_t> byte_count(DType dtype, const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
  }
  const std::optional<int64_t> n = checked_product(shape);
  if (!n) return std::nullopt;
  return checked_mul(*n, dtype_size(dtype));
}

std::string human_bytes(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} bytes", b) : fmt::format("{:.1f} {}", b, units[u]);
}

// The machine's physical memory in bytes (0 when unknown): an array larger than that cannot be
// held, so it is refused before asking the allocator (which may overcommit, or, under
// AddressSanitizer, abort instead of throwing std::bad_alloc).
int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return checked_mul(static_cast<int64_t>(pages), static_cast<int64_t>(page)).value_or(0);
}

}  // namespace

Array make_array(DType dtype, std::vector<int64_t> shape) {
  const std::optional<int64_t> bytes = byte_count(dtype, shape);
  if (!bytes) {
    throw Error(fmt::format("an array of {} {} has a negative extent or more than 2^63 bytes",
                            to_string(dtype), shape_str(shape)));
  }
  const int64_t memory = physical_memory_bytes();
  if (memory > 0 && *bytes > memory) {
    throw Error(fmt::format("cannot allocate {} for an array of {} {}: the machine has {}",
                            human_bytes(static_cast<double>(*bytes)), to_string(dtype),
                            shape_str(shape), human_bytes(static_cast<double>(memory))));
  }
  Array a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  try {
    a.bytes.assign(static_cast<size_t>(*bytes), 0);
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("cannot allocate {} for an array of {} {}",
                            human_bytes(static_cast<double>(*bytes)), to_string(dtype),
                            shape_str(a.shape)));
  } catch (const std::length_error&) {
    throw Error(fmt::format("cannot allocate {} for an array of {} {}",
                            human_bytes(static_cast<double>(*bytes)), to_string(dtype),
                            shape_str(a.shape)));
  }
  return a;
}

std::string_view descr(DType t) {
  switch (t) {
    case DType::F32:
      return "<f4";
    case DType::F16:
      return "<f2";
    case DType::BF16:
      return "<u2";
    case DType::I32:
      return "<i4";
    case DType::Bool:
      return "|b1";
  }
  FJ_ASSERT(false, "unknown DType");
}

Array parse(std::string_view file, const std::string& name) {
  if (file.size() < kMagicLen + 2 || file.substr(0, kMagicLen) != std::string_view(kMagic)) {
    throw Error(fmt::format("{}: not a .npy file (bad magic)", name));
  }
  const auto major = static_cast<unsigned char>(file[kMagicLen]);
  size_t header_len = 0;
  size_t pos = kMagicLen + 2;
  auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(file[i])); };
  if (major == 1) {
    if (file.size() < pos + 2) throw Error(fmt::format("{}: truncated .npy header", name));
    header_len = byte(pos) | byte(pos + 1) << 8;
    pos += 2;
  } else if (major == 2 || major == 3) {
    if (file.size() < pos + 4) throw Error(fmt::format("{}: truncated .npy header", name));
    header_len = byte(pos) | byte(pos + 1) << 8 | byte(pos + 2) << 16 | byte(pos + 3) << 24;
    pos += 4;
  } else {
    throw Error(
        fmt::format("{}: unsupported .npy format version {}.{}", name, major, byte(kMagicLen + 1)));
  }
  if (file.size() < pos + header_len) {
    throw Error(fmt::format("{}: truncated .npy header: needs {} bytes, file has {}", name,
                            header_len, file.size() - pos));
  }
  Header h = parse_header(file.substr(pos, header_len), name);
  pos += header_len;

  Array a;
  a.dtype = dtype_from_descr(h.descr, name);
  a.shape = h.shape;
  const size_t elem = static_cast<size_t>(dtype_size(a.dtype));
  const std::optional<int64_t> bytes = byte_count(a.dtype, a.shape);
  if (!bytes) {
    throw Error(fmt::format("{}: shape ({}) has more than 2^63 bytes of data", name,
                            fmt::join(h.shape, ", ")));
  }
  const size_t want = static_cast<size_t>(*bytes);
  const size_t have = file.size() - pos;
  if (have < want) {
    throw Error(fmt::format("{}: truncated: header says {} bytes of data ({} x {}), file has {}",
                            name, want, h.descr, fmt::join(h.shape, "x"), have));
  }
  const char* data = file.data() + pos;
  if (h.fortran_order && a.shape.size() > 1) {
    a.bytes = fortran_to_c(data, a.shape, elem, a.numel());
  } else {
    a.bytes.assign(data, data + want);
  }
  if (h.descr == "|u1") {
    for (char& c : a.bytes)
      c = c != 0 ? 1 : 0;  // kernels read bool bytes as 0 / 1
  }
  return a;
}

Array read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

std::string serialize(const Array& a) {
  FJ_ASSERT(a.bytes.size() == static_cast<size_t>(a.numel()) * dtype_size(a.dtype),
            "npy::Array bytes do not match its shape and dtype");
  // numpy writes 1-tuples with a trailing comma: (5,)
  std::string shape = a.shape.size() == 1 ? fmt::format("({},)", a.shape[0])
                                          : fmt::format("({})", fmt::join(a.shape, ", "));
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 descr(a.dtype), shape);
  // Pad with spaces so that magic + version + length + dict + '\n' is a multiple of 64.
  auto padded = [&](size_t prefix) {
    size_t total = prefix + dict.size() + 1;
    return dict + std::string((kHeaderAlign - total % kHeaderAlign) % kHeaderAlign, ' ') + "\n";
  };
  std::string header = padded(kMagicLen + 2 + 2);
  const bool v2 = header.size() > 0xffff;
  if (v2) header = padded(kMagicLen + 2 + 4);
  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  const size_t n = header.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (v2) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  out += header;
  out.append(a.bytes.data(), a.bytes.size());
  return out;
}

void write(const std::string& path, const Array& a) {
  std::string bytes = serialize(a);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

}  // namespace flexjit::npy
