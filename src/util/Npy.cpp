#include "util/Npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/CheckedMath.h"
#include "util/InputFiles.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>

#include <unistd.h>

namespace flexjit::npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// The header (magic through the newline) is padded to a multiple of this for alignment.
constexpr size_t kHeaderAlign = 64;
// The longest header read (numpy's np.load refuses more than 10,000 bytes unless told otherwise;
// flexjit's own writer never comes near this).
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// The header dict, a Python literal such as {'descr': '<f4', 'fortran_order': False, 'shape':
// (2, 3), }. numpy reads it with ast.literal_eval and requires exactly these three keys; this
// parser accepts the same literals (either quote, any whitespace, trailing commas) and rejects a
// duplicate key (Python keeps the last one, an earlier reader here took the first) or any
// other key.
class HeaderParser {
 public:
  HeaderParser(std::string_view dict, const std::string& name) : s_(dict), name_(name) {}

  Header parse() {
    Header h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{', "the header is not a dict");
    while (!eat('}')) {
      const std::string key = string_literal("a key");
      bool* seen = key == "descr"           ? &have_descr
                   : key == "fortran_order" ? &have_fortran
                   : key == "shape"         ? &have_shape
                                            : nullptr;
      if (seen == nullptr) {
        fail(
            fmt::format("unknown key '{}' (a .npy header has exactly 'descr', 'fortran_order' "
                        "and 'shape')",
                        key));
      }
      if (*seen) fail(fmt::format("the key '{}' appears twice", key));
      *seen = true;
      expect(':', fmt::format("no ':' after '{}'", key));
      if (key == "descr") {
        skip_space();
        if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) {
          fail("descr is not a string (structured dtypes are not supported)");
        }
        h.descr = string_literal("descr");
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
      } else {
        h.shape = shape();
      }
      if (!eat(',')) {
        expect('}', "expected ',' or '}' after a value");
        break;
      }
    }
    skip_space();
    if (i_ != s_.size()) fail("text after the closing '}'");
    for (auto [seen, key] :
         {std::pair{have_descr, "descr"}, {have_fortran, "fortran_order"}, {have_shape, "shape"}}) {
      if (!seen) {
        throw Error(fmt::format("{}: malformed .npy header: no '{}' in {}", name_, key, s_));
      }
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{}: malformed .npy header: {} in {}", name_, what, s_));
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const std::string& what) {
    if (!eat(c)) fail(what);
  }
  std::string string_literal(const char* what) {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) {
      fail(fmt::format("{} is not a quoted string", what));
    }
    const char quote = s_[i_];
    const size_t end = s_.find(quote, i_ + 1);
    if (end == std::string_view::npos) fail(fmt::format("unterminated string ({})", what));
    std::string out(s_.substr(i_ + 1, end - i_ - 1));
    if (out.find('\\') != std::string::npos) fail(fmt::format("escapes in {}", what));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    for (auto [text, value] : {std::pair{std::string_view("True"), true}, {"False", false}}) {
      if (s_.substr(i_).starts_with(text)) {
        i_ += text.size();
        return value;
      }
    }
    fail("fortran_order is not True/False");
  }
  std::vector<int64_t> shape() {
    expect('(', "shape is not a tuple");
    std::vector<int64_t> dims;
    while (!eat(')')) {
      if (!dims.empty() && !eat(',')) fail("bad shape: expected ',' between dimensions");
      if (eat(')')) break;  // (5,)
      skip_space();
      size_t j = i_;
      while (j < s_.size() && s_[j] >= '0' && s_[j] <= '9')
        ++j;
      if (j == i_) {
        const size_t close = s_.find(')', i_);
        fail(fmt::format(
            "bad shape ({})",
            s_.substr(i_, close == std::string_view::npos ? std::string_view::npos : close - i_)));
      }
      const std::string digits(s_.substr(i_, j - i_));
      errno = 0;
      const long long dim = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        throw Error(
            fmt::format("{}: malformed .npy header: dimension {} is too large", name_, digits));
      }
      dims.push_back(dim);
      i_ = j;
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 longs, as old numpy wrote them
    }
    return dims;
  }

  std::string_view s_;
  const std::string& name_;
  size_t i_ = 0;
};

Header parse_header(std::string_view dict, const std::string& name) {
  return HeaderParser(dict, name).parse();
}

DType dtype_from_descr(std::string descr, const std::string& name) {
  if (!descr.empty() && descr[0] == '=') descr[0] = '<';  // native: little-endian hosts only
  if (descr == "<f4") return DType::F32;
  if (descr == "<f2") return DType::F16;
  if (descr == "<i4") return DType::I32;
  if (descr == "|b1" || descr == "|u1") return DType::Bool;
  if (descr == "<u2" || descr == "<V2" || descr == "|V2") return DType::BF16;
  if (descr == "|V1" || descr == "<V1") return DType::E4M3;
  throw Error(fmt::format(
      "{}: unsupported dtype '{}' (flexjit reads <f4 <f2 <i4 |b1 |u1, bf16 as <u2 or <V2, and "
      "e4m3 as |V1)",
      name, descr));
}

// Reorders Fortran-order elements (first index fastest) into C order, into `out` (numel * elem).
void fortran_to_c(const char* src, const std::vector<int64_t>& shape, size_t elem, int64_t numel,
                  char* out) {
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
    std::memcpy(out + c * elem, src + f * elem, elem);
    for (size_t d = nd; d-- > 0;) {  // C order: last index fastest
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
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
    case DType::E4M3:
      return "|V1";
  }
  FJ_ASSERT(false, "unknown DType");
}

namespace {

// Where the bytes of a .npy come from: memory (parse) or an open regular file (read). Nothing is
// read before the sizes that the header implies have been checked against `size`.
struct Source {
  uint64_t size = 0;
  std::function<void(uint64_t offset, char* dst, size_t n)> read;
  std::string bytes(uint64_t offset, size_t n) const {
    std::string out(n, '\0');
    read(offset, out.data(), n);
    return out;
  }
};

Array load(const Source& src, const std::string& name) {
  const std::string magic = src.bytes(0, static_cast<size_t>(std::min<uint64_t>(src.size, 12)));
  if (magic.size() < kMagicLen + 2 || magic.substr(0, kMagicLen) != std::string_view(kMagic)) {
    throw Error(fmt::format("{}: not a .npy file (bad magic)", name));
  }
  const auto major = static_cast<unsigned char>(magic[kMagicLen]);
  uint64_t header_len = 0;
  size_t pos = kMagicLen + 2;
  auto byte = [&](size_t i) { return uint64_t{static_cast<unsigned char>(magic[i])}; };
  if (major == 1) {
    if (magic.size() < pos + 2) throw Error(fmt::format("{}: truncated .npy header", name));
    header_len = byte(pos) | byte(pos + 1) << 8;
    pos += 2;
  } else if (major == 2 || major == 3) {
    if (magic.size() < pos + 4) throw Error(fmt::format("{}: truncated .npy header", name));
    header_len = byte(pos) | byte(pos + 1) << 8 | byte(pos + 2) << 16 | byte(pos + 3) << 24;
    pos += 4;
  } else {
    throw Error(
        fmt::format("{}: unsupported .npy format version {}.{}", name, major, byte(kMagicLen + 1)));
  }
  if (src.size < pos + header_len) {
    throw Error(fmt::format("{}: truncated .npy header: needs {} bytes, file has {}", name,
                            header_len, src.size - pos));
  }
  if (header_len > kMaxHeaderBytes) {
    throw Error(fmt::format("{}: the .npy header is {} bytes, more than the {} that flexjit reads",
                            name, header_len, files::human_size(kMaxHeaderBytes)));
  }
  const Header h = parse_header(src.bytes(pos, static_cast<size_t>(header_len)), name);
  pos += static_cast<size_t>(header_len);

  const DType dtype = dtype_from_descr(h.descr, name);
  const size_t elem = static_cast<size_t>(dtype_size(dtype));
  const std::optional<int64_t> bytes = byte_count(dtype, h.shape);
  if (!bytes) {
    throw Error(fmt::format("{}: shape ({}) has more than 2^63 bytes of data", name,
                            fmt::join(h.shape, ", ")));
  }
  const uint64_t want = static_cast<uint64_t>(*bytes);
  const uint64_t have = src.size - pos;
  if (have < want) {
    throw Error(fmt::format("{}: truncated: header says {} bytes of data ({} x {}), file has {}",
                            name, want, h.descr, fmt::join(h.shape, "x"), have));
  }
  Array a;
  try {
    a = make_array(dtype, h.shape);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", name, e.what()));
  }
  if (h.fortran_order && a.shape.size() > 1) {
    std::vector<char> fortran;
    try {
      fortran.resize(static_cast<size_t>(want));
    } catch (const std::bad_alloc&) {
      throw Error(fmt::format("{}: cannot allocate {} to transpose the Fortran-order data", name,
                              human_bytes(static_cast<double>(want))));
    }
    src.read(pos, fortran.data(), fortran.size());
    fortran_to_c(fortran.data(), a.shape, elem, a.numel(), a.bytes.data());
  } else {
    src.read(pos, a.bytes.data(), a.bytes.size());
  }
  if (h.descr == "|u1") {
    for (char& c : a.bytes)
      c = c != 0 ? 1 : 0;  // kernels read bool bytes as 0 / 1
  }
  return a;
}

}  // namespace

Array parse(std::string_view file, const std::string& name) {
  Source src;
  src.size = file.size();
  src.read = [file](uint64_t offset, char* dst, size_t n) {
    if (n != 0) std::memcpy(dst, file.data() + offset, n);  // an empty array's data is null
  };
  return load(src, name);
}

Array read(const std::string& path) {
  const files::InputFile f(path, fmt::format("{}: cannot open for reading", path));
  Source src;
  src.size = f.size();
  src.read = [&f](uint64_t offset, char* dst, size_t n) { f.read_at(offset, dst, n); };
  return load(src, path);
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
