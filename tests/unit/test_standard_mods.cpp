// The standard mods in dsl/: every file loads, type-checks, round-trips, and means what the
// PyTorch anchors (shared/anchors/torch_flex_bench.py) mean where they overlap.
#include <flexjit/dsl.h>
#include <flexjit/mods.h>

#include "ir/IR.h"
#include "ir/Printer.h"
#include "util/Embedded.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <unistd.h>

using namespace flexjit;

namespace {

// A tiny evaluator for the ops the standard mods use, so that the tests can check what a mod
// computes without a backend. Integer / and % follow the language (floor division).
struct Env {
  float score = 0.0f;
  int32_t b = 0, h = 0, q = 0, kv = 0;
  std::map<std::string, std::function<double(const std::vector<int64_t>&)>> buffers;
  std::map<std::string, double> params;
};

double eval(const Expr& e, const Env& env) {
  const ir::Node& n = *e.get();
  auto arg = [&](size_t i) { return eval(n.args[i], env); };
  auto as_int = [](double v) { return static_cast<int64_t>(v); };
  switch (n.op) {
    case ir::Op::IntImm:
    case ir::Op::BoolImm:
      return static_cast<double>(n.ival);
    case ir::Op::FloatImm:
      return n.fval;
    case ir::Op::Var:
      switch (n.var) {
        case ir::VarKind::Score:
          return env.score;
        case ir::VarKind::B:
          return env.b;
        case ir::VarKind::H:
          return env.h;
        case ir::VarKind::QIdx:
          return env.q;
        case ir::VarKind::KvIdx:
          return env.kv;
      }
      break;
    case ir::Op::Param:
      return env.params.at(n.param->name);
    case ir::Op::Load: {
      std::vector<int64_t> idx;
      for (size_t i = 0; i < n.args.size(); ++i)
        idx.push_back(as_int(arg(i)));
      return env.buffers.at(n.buffer->name)(idx);
    }
    case ir::Op::Cast: {
      double v = arg(0);
      if (n.type == ScalarType::F32) return static_cast<float>(v);
      if (std::isnan(v)) return 0;
      return std::trunc(std::clamp(v, -2147483648.0, 2147483647.0));
    }
    case ir::Op::Select:
      return arg(0) != 0 ? arg(1) : arg(2);
    case ir::Op::Neg:
      return -arg(0);
    case ir::Op::Not:
      return arg(0) == 0;
    case ir::Op::Abs:
      return std::fabs(arg(0));
    case ir::Op::Log:
      return std::log(static_cast<float>(arg(0)));
    case ir::Op::Tanh:
      return std::tanh(static_cast<float>(arg(0)));
    case ir::Op::Floor:
      return std::floor(arg(0));
    case ir::Op::Add:
      return n.type == ScalarType::F32 ? static_cast<float>(arg(0) + arg(1)) : arg(0) + arg(1);
    case ir::Op::Sub:
      return n.type == ScalarType::F32 ? static_cast<float>(arg(0) - arg(1)) : arg(0) - arg(1);
    case ir::Op::Mul:
      return n.type == ScalarType::F32 ? static_cast<float>(arg(0) * arg(1)) : arg(0) * arg(1);
    case ir::Op::Div:
      if (n.type == ScalarType::F32) return static_cast<float>(arg(0) / arg(1));
      return arg(1) == 0 ? 0 : std::floor(arg(0) / arg(1));
    case ir::Op::Mod:
      if (n.type == ScalarType::I32) {
        return arg(1) == 0 ? 0 : arg(0) - arg(1) * std::floor(arg(0) / arg(1));
      }
      break;
    case ir::Op::Min:
      return std::min(arg(0), arg(1));
    case ir::Op::Max:
      return std::max(arg(0), arg(1));
    case ir::Op::EQ:
      return arg(0) == arg(1);
    case ir::Op::NE:
      return arg(0) != arg(1);
    case ir::Op::LT:
      return arg(0) < arg(1);
    case ir::Op::LE:
      return arg(0) <= arg(1);
    case ir::Op::GT:
      return arg(0) > arg(1);
    case ir::Op::GE:
      return arg(0) >= arg(1);
    case ir::Op::And:
      return arg(0) != 0 && arg(1) != 0;
    case ir::Op::Or:
      return arg(0) != 0 || arg(1) != 0;
    default:
      break;
  }
  FAIL("the test evaluator does not handle " << ir::op_name(n.op));
  return 0;
}

Env with_defaults(const Mods& m) {
  Env env;
  for (const auto& p : m.params) {
    if (p.decl()->default_value) env.params[p.name()] = *p.decl()->default_value;
  }
  return env;
}

}  // namespace

TEST_CASE("the standard mods are the expected set, one comment line each", "[dsl][standard]") {
  std::vector<std::string> expected = {"alibi",
                                       "alibi_causal",
                                       "causal",
                                       "chunked_local",
                                       "dilated_sliding",
                                       "document",
                                       "document_causal",
                                       "noop",
                                       "prefix_lm",
                                       "relative_bias",
                                       "relative_bias_causal",
                                       "sinks",
                                       "sinks_sliding_window",
                                       "sliding_window",
                                       "softcap",
                                       "softcap_causal",
                                       "t5_bucketed_bias"};
  CHECK(standard_mod_names() == expected);
  for (const auto& name : standard_mod_names()) {
    INFO(name);
    const std::string& src = standard_mod_source(name);
    CHECK(src.rfind("// " + name + ": ", 0) == 0);  // first line says what it is
    CHECK(&standard_mod_source(name + ".fx") == &src);
  }
}

TEST_CASE("every standard mod loads, type-checks and round-trips", "[dsl][standard]") {
  for (const auto& name : standard_mod_names()) {
    INFO(name);
    Mods m = standard_mods(name);
    CHECK(m.name == name);
    REQUIRE_NOTHROW(m.check());
    CHECK((m.score_mod.defined() || m.mask_mod.defined() || m.sink_mod.defined()));
    if (m.score_mod.defined()) CHECK(m.score_mod.type() == ScalarType::F32);
    if (m.sink_mod.defined()) CHECK(m.sink_mod.type() == ScalarType::F32);
    if (m.mask_mod.defined()) CHECK(m.mask_mod.type() == ScalarType::Bool);
    Mods again = parse_mods(m.to_text(), name + ".printed");
    CHECK(equal(m, again));
    CHECK(m.hash() == again.hash());
    CHECK(again.to_text() == m.to_text());
    // Every declared param has a default, so the CLI can run a standard mod as is.
    for (const auto& p : m.params)
      CHECK(p.decl()->default_value.has_value());
  }
}

TEST_CASE("standard mods equal the PyTorch anchors built in C++", "[dsl][standard]") {
  auto same = [](const Mods& a, const Mods& b) {
    INFO(a.to_text() << "vs\n" << b.to_text());
    CHECK(equal(a, b));
    CHECK(a.hash() == b.hash());
  };
  auto causal = [](Expr, Expr, Expr q, Expr kv) { return q >= kv; };
  same(standard_mods("noop"), Mods::from([](Expr s, Expr, Expr, Expr, Expr) { return s; }));
  same(standard_mods("causal"), Mods::from_mask(causal));

  Param window("window", ScalarType::I32, 1024);
  same(standard_mods("sliding_window"),
       Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) { return q >= kv && q - kv <= window; }));
  Param prefix("prefix", ScalarType::I32, 1024);
  same(standard_mods("prefix_lm"),
       Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) { return kv <= prefix || q >= kv; }));
  Buffer doc("doc_id", DType::I32, {"S"});
  same(standard_mods("document"),
       Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) { return doc[q] == doc[kv]; }));
  same(standard_mods("document_causal"),
       Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) { return doc[q] == doc[kv] && q >= kv; }));
  Buffer slopes("slopes", DType::F32, {"H"});
  auto alibi = [&](Expr s, Expr, Expr h, Expr q, Expr kv) { return s + slopes[h] * (kv - q); };
  same(standard_mods("alibi"), Mods::from(alibi));
  same(standard_mods("alibi_causal"), Mods::from(alibi, causal));
  Param cap("cap", ScalarType::F32, 30.0);
  auto softcap = [&](Expr s, Expr, Expr, Expr, Expr) { return cap * tanh(s / cap); };
  same(standard_mods("softcap"), Mods::from(softcap));
  same(standard_mods("softcap_causal"), Mods::from(softcap, causal));
  Buffer bias("bias", DType::F32, {"R"});
  Param offset("offset", ScalarType::I32, 4096);
  auto rel = [&](Expr s, Expr, Expr, Expr q, Expr kv) { return s + bias[q - kv + offset]; };
  same(standard_mods("relative_bias"), Mods::from(rel));
  same(standard_mods("relative_bias_causal"), Mods::from(rel, causal));
  Param chunk("chunk", ScalarType::I32, 1024);
  same(standard_mods("chunked_local"), Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) {
         return q / chunk == kv / chunk && q >= kv;
       }));
  Param dilation("dilation", ScalarType::I32, 2);
  same(standard_mods("dilated_sliding"), Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) {
         return q >= kv && q - kv <= window && (q - kv) % dilation == 0;
       }));
}

TEST_CASE("standard mods compute what their comments say", "[dsl][standard]") {
  SECTION("dilated_sliding keeps every dilation-th key inside the causal window") {
    Mods m = standard_mods("dilated_sliding");
    Env env = with_defaults(m);
    auto keep = [&](int q, int kv) {
      env.q = q;
      env.kv = kv;
      return eval(m.mask_mod, env) != 0;
    };
    CHECK(keep(5000, 5000));
    CHECK(keep(5000, 4998));
    CHECK_FALSE(keep(5000, 4999));
    CHECK(keep(5000, 5000 - 1024));
    CHECK_FALSE(keep(5000, 5000 - 1026));
    CHECK_FALSE(keep(5000, 5002));
  }
  SECTION("chunked_local attends causally within chunks of 1024") {
    Mods m = standard_mods("chunked_local");
    Env env = with_defaults(m);
    auto keep = [&](int q, int kv) {
      env.q = q;
      env.kv = kv;
      return eval(m.mask_mod, env) != 0;
    };
    CHECK(keep(1500, 1024));
    CHECK_FALSE(keep(1500, 1023));
    CHECK_FALSE(keep(1023, 1024));
    CHECK(keep(1023, 0));
  }
  SECTION("t5_bucketed_bias uses T5's bidirectional log buckets") {
    Mods m = standard_mods("t5_bucketed_bias");
    Env env = with_defaults(m);
    int64_t seen_bucket = -1;
    env.buffers["bias"] = [&](const std::vector<int64_t>& idx) {
      REQUIRE(idx.size() == 2);
      CHECK(idx[0] == env.h);
      seen_bucket = idx[1];
      return 0.25 * static_cast<double>(idx[1]);
    };
    // HF transformers T5Attention._relative_position_bucket(bidirectional=True, 32, 128), with
    // its f32 arithmetic.
    auto t5_bucket = [](int rel) {
      int bucket = rel > 0 ? 16 : 0;
      int n = std::abs(rel);
      if (n < 8) return bucket + n;
      float large =
          std::log(static_cast<float>(n) / 8.0f) / static_cast<float>(std::log(16.0)) * 8.0f;
      return bucket + std::min(8 + static_cast<int>(large), 15);
    };
    std::map<int, int> golden = {{0, 0},    {1, 17},   {-1, 1},    {7, 23},
                                 {-7, 7},   {8, 24},   {-8, 8},    {12, 25},
                                 {127, 31}, {128, 31}, {-128, 15}, {-100000, 15}};
    for (int rel = -3000; rel <= 3000; ++rel) {
      env.q = 5000;
      env.kv = 5000 + rel;
      env.h = rel & 7;
      env.score = 1.5f;
      double out = eval(m.score_mod, env);
      INFO("rel = " << rel);
      REQUIRE(seen_bucket == t5_bucket(rel));
      CHECK(out == Approx(1.5 + 0.25 * static_cast<double>(t5_bucket(rel))));
      if (golden.count(rel)) CHECK(seen_bucket == golden[rel]);
    }
  }
}

TEST_CASE("resolve_mods takes a standard name, a file or inline text", "[dsl][standard]") {
  CHECK(equal(resolve_mods("alibi"), standard_mods("alibi")));
  CHECK(equal(resolve_mods("alibi.fx"), standard_mods("alibi")));
  Mods inl = resolve_mods("param w: i32 = 8; mask_mod = q_idx - kv_idx <= w");
  CHECK(inl.name == "<inline>");
  CHECK(inl.params.size() == 1);

  std::string path = (std::filesystem::temp_directory_path() /
                      ("flexjit_test_mods_" + std::to_string(::getpid()) + ".fx"))
                         .string();
  {
    std::ofstream out(path);
    out << "// mine\nmask_mod = q_idx >= kv_idx\n";
  }
  Mods f = resolve_mods(path);
  CHECK(f.name == path);
  CHECK(equal(f, standard_mods("causal")));
  {
    std::ofstream out(path);
    out << "mask_mod = q_idx >= kvidx\n";
  }
  CHECK_THROWS_WITH(resolve_mods(path), Catch::StartsWith(path + ":1:21: error: unknown"));
  std::remove(path.c_str());

  CHECK_THROWS_AS(resolve_mods("alibii"), Error);
  CHECK_THROWS_WITH(resolve_mods("alibii"), Catch::Contains("not a standard mod") &&
                                                Catch::Contains("alibi, alibi_causal"));
  CHECK_THROWS_WITH(standard_mods("nope"), Catch::Contains("unknown standard mod 'nope'"));
  CHECK_THROWS_WITH(load_mods_file("/nonexistent/x.fx"),
                    Catch::Contains("cannot read mods file '/nonexistent/x.fx'"));
  CHECK_THROWS_WITH(load_mods_file(std::filesystem::temp_directory_path().string()),
                    Catch::Contains("is a directory"));
}

TEST_CASE("standard mod files are embedded under their dsl/ names", "[dsl][standard]") {
  bool found = false;
  for (const auto& f : embedded::dsl())
    found = found || std::string(f.name) == "alibi.fx";
  CHECK(found);
}
