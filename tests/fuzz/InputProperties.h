// The properties that the `.npy` reader and the tuning-manifest parser must have on any input,
// shared by their libFuzzer targets (fuzz_npy.cpp, fuzz_manifest.cpp) and the regression test
// over tests/fuzz/npy_corpus and tests/fuzz/manifest_corpus (test_fuzz_corpus.cpp).
#pragma once

#include <flexjit/error.h>

#include "tune/Manifest.h"
#include "util/Npy.h"

#include <string>

namespace flexjit::fuzz {

// Any byte string must either be read as an array or throw a flexjit::Error. What is read must
// be consistent (bytes == numel x element size, no negative extent) and must write (serialize)
// as a file that reads back to the same dtype, shape and bytes. Returns "" when that holds, else
// what broke; any other exception (std::bad_alloc, an InternalError) propagates: a bug as well.
inline std::string npy_property_violation(const std::string& bytes) {
  npy::Array a;
  try {
    a = npy::parse(bytes, "fuzz.npy");
  } catch (const Error&) {
    return {};
  }
  for (int64_t d : a.shape) {
    if (d < 0) return "a negative extent was accepted";
  }
  if (a.bytes.size() != static_cast<size_t>(a.numel()) * dtype_size(a.dtype)) {
    return "the array's bytes do not match its shape";
  }
  npy::Array b;
  try {
    b = npy::parse(npy::serialize(a), "roundtrip.npy");
  } catch (const Error& e) {
    return std::string("the written file does not read back: ") + e.what();
  }
  if (b.dtype != a.dtype || b.shape != a.shape || b.bytes != a.bytes) {
    return "the written file reads back as a different array";
  }
  return {};
}

// Any text must either load as a manifest or throw a flexjit::Error ("fuzz.json: workload 2
// ('name'): ..."); a loaded manifest has at least one workload, each with at least one shape of
// positive extents. Relative mods_file paths resolve against a directory that does not exist.
inline std::string manifest_property_violation(const std::string& text) {
  tune::Manifest m;
  try {
    m = tune::parse_manifest(text, "fuzz.json", "/nonexistent/flexjit-fuzz");
  } catch (const Error&) {
    return {};
  }
  if (m.workloads.empty()) return "a manifest without workloads was accepted";
  for (const tune::Workload& w : m.workloads) {
    if (w.shapes.empty()) return "a workload without shapes was accepted";
    for (const tune::WorkloadShape& s : w.shapes) {
      if (s.batch <= 0 || s.heads_q <= 0 || s.seqlen_q <= 0 || s.seqlen_kv <= 0) {
        return "a shape with an extent that is not positive was accepted";
      }
    }
  }
  return {};
}

}  // namespace flexjit::fuzz
