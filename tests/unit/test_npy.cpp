#include "util/Npy.h"

#include "support/CacheTest.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

using namespace flexjit;
namespace fs = std::filesystem;

namespace {

// A hand-built .npy file (format 1.0) with the given header dict and payload.
std::string npy_file(const std::string& dict, const std::string& payload, char major = 1) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += major;
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + payload;
}

}  // namespace

TEST_CASE("npy round trips every dtype", "[npy]") {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::Bool}) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {5}, {2, 3, 4}, {0, 3}}) {
      npy::Array a = npy::make_array(t, shape);
      for (size_t i = 0; i < a.bytes.size(); ++i) {
        a.bytes[i] = static_cast<char>(t == DType::Bool ? i % 2 : i * 37 + 1);
      }
      const std::string bytes = npy::serialize(a);
      // numpy's alignment rule: the data starts at a multiple of 64.
      CHECK((bytes.size() - a.bytes.size()) % 64 == 0);
      CHECK(bytes.find(std::string(npy::descr(t))) != std::string::npos);
      npy::Array b = npy::parse(bytes, "x.npy");
      CHECK(b.dtype == t);
      CHECK(b.shape == a.shape);
      CHECK(b.bytes == a.bytes);
    }
  }
  // Through a file.
  npy::Array a = npy::make_array(DType::F32, {3});
  a.as<float>()[2] = 1.5f;
  flexjit::test::TempDir dir;
  const std::string path = (dir.path() / "a.npy").string();
  npy::write(path, a);
  npy::Array b = npy::read(path);
  CHECK(b.as<float>()[2] == 1.5f);
  std::remove(path.c_str());
}

TEST_CASE("npy writes bf16 as <u2 and reads bf16 as <u2 or <V2", "[npy]") {
  npy::Array a = npy::make_array(DType::BF16, {2});
  const std::string bytes = npy::serialize(a);
  CHECK(bytes.find("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }") !=
        std::string::npos);
  const std::string payload("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  npy::Array v =
      npy::parse(npy_file("{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", payload));
  CHECK(v.dtype == DType::BF16);
  CHECK(v.as<uint16_t>()[0] == 0x3f80);
  npy::Array u = npy::parse(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }",
                                     std::string("\x00\x05\x01", 3)));
  CHECK(u.dtype == DType::Bool);
  CHECK(u.bytes == std::vector<char>{0, 1, 1});
}

TEST_CASE("npy transposes Fortran-order arrays and reads format 2.0", "[npy]") {
  // [[0, 1, 2], [3, 4, 5]] stored column-major: 0 3 1 4 2 5.
  std::vector<int32_t> f = {0, 3, 1, 4, 2, 5};
  std::string payload(reinterpret_cast<const char*>(f.data()), f.size() * 4);
  npy::Array a =
      npy::parse(npy_file("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", payload));
  for (int i = 0; i < 6; ++i)
    CHECK(a.as<int32_t>()[i] == i);

  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
  std::string v2("\x93NUMPY\x02\x00", 8);
  std::string header = dict + "\n";
  v2 += static_cast<char>(header.size());
  v2 += std::string(3, '\0');
  float one = 1.0f;
  v2 += header + std::string(reinterpret_cast<const char*>(&one), 4);
  CHECK(npy::parse(v2).as<float>()[0] == 1.0f);
}

TEST_CASE("npy errors are precise", "[npy]") {
  CHECK_THROWS_WITH(npy::parse("PK\x03\x04 not npy", "a.npy"),
                    "a.npy: not a .npy file (bad magic)");
  CHECK_THROWS_WITH(npy::parse(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                                        std::string(16, '\0')),
                               "d.npy"),
                    Catch::StartsWith("d.npy: unsupported dtype '<f8'"));
  CHECK_THROWS_WITH(npy::parse(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
                                        std::string(8, '\0')),
                               "e.npy"),
                    Catch::StartsWith("e.npy: unsupported dtype '>f4'"));
  CHECK_THROWS_WITH(
      npy::parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                          std::string(12, '\0')),
                 "t.npy"),
      Catch::Contains("t.npy: truncated: header says 24 bytes of data") &&
          Catch::Contains("file has 12"));
  std::string cut = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "");
  CHECK_THROWS_WITH(npy::parse(cut.substr(0, 30), "h.npy"),
                    Catch::StartsWith("h.npy: truncated .npy header"));
  CHECK_THROWS_WITH(npy::parse(npy_file("{'descr': '<f4', 'shape': (2,), }", ""), "k.npy"),
                    Catch::Contains("no 'fortran_order'"));
  CHECK_THROWS_WITH(npy::read("/nonexistent/x.npy"),
                    Catch::StartsWith("/nonexistent/x.npy: cannot open for reading"));
}

TEST_CASE("npy checks every size before allocating or reading (issue 14)", "[npy]") {
  auto header = [](const std::string& shape, const char* fortran = "False") {
    return fmt::format("{{'descr': '<f4', 'fortran_order': {}, 'shape': {}, }}", fortran, shape);
  };
  // A 384-byte file whose header claims 7623851 x 1229673 x 3935371 x 64 floats: the element
  // count wraps int64, and the wrapped count once passed the truncation check.
  const std::string huge = npy_file(header("(7623851, 1229673, 3935371, 64)"), std::string(256, 0));
  CHECK(huge.size() == 384);
  CHECK_THROWS_WITH(npy::parse(huge, "huge.npy"),
                    "huge.npy: shape (7623851, 1229673, 3935371, 64) has more than 2^63 bytes of "
                    "data");
  // (1, 1, 2^62, 4): 2^64 elements.
  CHECK_THROWS_WITH(npy::parse(npy_file(header("(1, 1, 4611686018427387904, 4)"), ""), "p.npy"),
                    Catch::Contains("p.npy: shape (1, 1, 4611686018427387904, 4) has more than"));
  // A Fortran-order file with a huge first dimension (the transposition used to run first).
  CHECK_THROWS_WITH(
      npy::parse(npy_file(header("(4611686018427387904, 8)", "True"), std::string(64, 0)), "f.npy"),
      Catch::Contains("f.npy: shape (4611686018427387904, 8) has more than"));
  CHECK_THROWS_WITH(
      npy::parse(npy_file(header("(1000000, 8)", "True"), std::string(64, 0)), "t.npy"),
      Catch::Contains("t.npy: truncated"));
  // A dimension past int64 (std::stoll threw std::out_of_range, an "unexpected error").
  CHECK_THROWS_WITH(npy::parse(npy_file(header("(99999999999999999999999,)"), ""), "d.npy"),
                    "d.npy: malformed .npy header: dimension 99999999999999999999999 is too large");
  // make_array: overflow and allocation failures are errors with the shape.
  CHECK_THROWS_WITH(npy::make_array(DType::F32, {1 << 24, 1 << 24, 1 << 24, 1 << 24}),
                    Catch::Contains("more than 2^63 bytes"));
  CHECK_THROWS_WITH(
      npy::make_array(DType::F32, {int64_t{1} << 58}),
      Catch::Contains("cannot allocate 1.0 EiB") && Catch::Contains("the machine has"));
}

TEST_CASE("npy rejects duplicate, unknown and malformed header keys as numpy does (issue 34)",
          "[npy]") {
  const std::string payload(8, '\0');
  // NumPy's literal_eval keeps the last 'descr'; reading the first one silently disagreed.
  CHECK_THROWS_WITH(
      npy::parse(npy_file("{'descr': '<f4', 'descr': '<i4', 'fortran_order': False, "
                          "'shape': (2,), }",
                          payload),
                 "dup.npy"),
      Catch::StartsWith("dup.npy: malformed .npy header: the key 'descr' appears twice"));
  CHECK_THROWS_WITH(npy::parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                                        "'shape': (1,), }",
                                        payload),
                               "dup2.npy"),
                    Catch::Contains("the key 'shape' appears twice"));
  CHECK_THROWS_WITH(
      npy::parse(
          npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", payload),
          "x.npy"),
      Catch::Contains("unknown key 'x'"));
  CHECK_THROWS_WITH(
      npy::parse(
          npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", payload),
          "j.npy"),
      Catch::Contains("text after the closing '}'"));
  CHECK_THROWS_WITH(
      npy::parse(npy_file("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", payload),
                 "m.npy"),
      Catch::Contains("fortran_order is not True/False"));
  // What numpy writes, in either quote style and spacing, still reads.
  npy::Array a = npy::parse(
      npy_file("{\"shape\":(2,),\"fortran_order\":False,\"descr\":\"<f4\"}", payload), "ok.npy");
  CHECK(a.shape == std::vector<int64_t>{2});
  npy::Array b = npy::parse(
      npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2L), }", payload), "l.npy");
  CHECK(b.shape == std::vector<int64_t>{1, 2});
}

TEST_CASE("npy::read checks the header and the file size before reading (issue 34)", "[npy]") {
  flexjit::test::TempDir dir;
  // Not regular files: refused at once (a FIFO used to block, /dev/zero to be read forever).
  const std::string fifo = (dir.path() / "f.npy").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(npy::read(fifo), fifo +
                                         ": cannot open for reading: it is a FIFO (named pipe); "
                                         "flexjit reads regular files only, whose size it can "
                                         "check before reading");
  CHECK_THROWS_WITH(npy::read("/dev/zero"), Catch::StartsWith("/dev/zero: cannot open for reading: "
                                                              "it is a device"));
  CHECK_THROWS_WITH(npy::read(dir.path().string()), Catch::Contains("it is a directory"));
  // A sparse 1 TiB file whose header claims 1 TiB of data: refused from the header (it used to be
  // read whole first, 14 s for 100 GB), naming the size and the machine's memory.
  const std::string sparse = (dir.path() / "sparse.npy").string();
  {
    npy::Array small = npy::make_array(DType::F32, {0});
    std::string bytes = npy::serialize(small);
    const std::string old_shape = "(0,)";
    const std::string new_shape = "(256, 1073741824)";
    bytes.replace(bytes.find(old_shape), old_shape.size(), new_shape);
    bytes.erase(bytes.find('\n') - (new_shape.size() - old_shape.size()),
                new_shape.size() - old_shape.size());  // keep the header length
    std::ofstream(sparse, std::ios::binary) << bytes;
    fs::resize_file(sparse, bytes.size() + (uint64_t{1} << 40));
  }
  CHECK_THROWS_WITH(npy::read(sparse),
                    Catch::StartsWith(sparse + ": cannot allocate 1.0 TiB for an array of f32 "
                                               "[256, 1073741824]"));
  // A file shorter than its header says: the sizes, before any data is read.
  const std::string cut = (dir.path() / "cut.npy").string();
  {
    npy::Array a = npy::make_array(DType::F32, {4, 4});
    std::string bytes = npy::serialize(a);
    bytes.resize(bytes.size() - 8);
    std::ofstream(cut, std::ios::binary) << bytes;
  }
  CHECK_THROWS_WITH(npy::read(cut), Catch::Contains("truncated: header says 64 bytes of data") &&
                                        Catch::Contains("file has 56"));
  // A header longer than any real one (format 2.0 allows 4 GiB): refused, not allocated.
  std::string long_header("\x93NUMPY\x02\x00\x00\x00\x40\x00", 12);  // 4 MiB
  long_header.resize(long_header.size() + (4 << 20), ' ');
  CHECK_THROWS_WITH(npy::parse(long_header, "long.npy"),
                    "long.npy: the .npy header is 4194304 bytes, more than the 1 MiB that flexjit "
                    "reads");
}

TEST_CASE("npy::Array::view is a contiguous CPU TensorRef of its bytes", "[npy]") {
  npy::Array a = npy::make_array(DType::BF16, {2, 3, 4});
  const TensorRef t = a.view();
  CHECK(t.data == a.bytes.data());
  CHECK(t.dtype == DType::BF16);
  CHECK(t.shape == std::vector<int64_t>{2, 3, 4});
  CHECK(t.strides == std::vector<int64_t>{12, 4, 1});
  CHECK(t.device == TensorRef::Device::CPU);
}
