// Issue 12 (hardening): sizes that must not overflow or allocate without bound, threads and
// interrupts, the exact range of the INT8 GEMM, and the HDF5 files' integrity and atomicity.
// Each test reproduces a failure seen before its fix.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "expect_error.h"
#include "io/model_store.h"
#include "kernels/gemm_s8.h"
#include "tiny_model.h"

using namespace socllm;
using namespace tiny_model;
namespace fs = std::filesystem;

namespace {

// Flips one byte in the middle of a dataset's first stored chunk.
void flip_byte_in(const std::string& path, const std::string& dataset) {
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
    hid_t sp = H5Dget_space(d);
    hsize_t offset[2];
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info(d, sp, 0, offset, &mask, &addr, &size), 0);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(f);
  }
  std::fstream fh(path, std::ios::in | std::ios::out | std::ios::binary);
  fh.seekg(static_cast<std::streamoff>(addr + size / 2));
  char c = 0;
  fh.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  fh.seekp(static_cast<std::streamoff>(addr + size / 2));
  fh.write(&c, 1);
}

}  // namespace

TEST(Hardening, SizesDoNotOverflow) {
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20, "x"), int64_t{1} << 40);
  EXPECT_THROW(checked_mul(int64_t{1} << 40, int64_t{1} << 40, "x"), ShapeError);
  // A stored shape whose element count leaves int64 was UB in numel() (UBSan).
  TensorF32 t;
  t.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THROW(t.numel(), ShapeError);
  EXPECT_THROW(TensorF32({int64_t{1} << 62, 8}), ShapeError);
}

TEST(Hardening, ThreadCountIsBounded) {
  const int before = num_threads();
  EXPECT_THROW(set_num_threads(0), InvalidArgument);
  EXPECT_THROW(set_num_threads(max_num_threads() + 1), InvalidArgument);
  EXPECT_THROW(set_num_threads(int64_t{1} << 40), InvalidArgument);
  EXPECT_GE(max_num_threads(), 4);
  EXPECT_EQ(num_threads(), before);
}

TEST(Hardening, GemmRejectsKBeyondTheExactRange) {
  // At the limit the worst case is exact: K * (-128) * (-128) and K * 255 * (-128).
  for (kernels::Isa isa : kernels::supported_isas()) {
    const int64_t K8 = kernels::kMaxExactKS8S8;
    std::vector<int8_t> a(K8, -128), b(K8, -128);
    int32_t c = 0;
    kernels::gemm_s8s8s32(a.data(), K8, b.data(), K8, &c, 1, 1, 1, K8, isa);
    EXPECT_EQ(c, K8 * 128 * 128) << kernels::isa_name(isa);
    const int64_t KU = kernels::kMaxExactKU8S8;
    std::vector<uint8_t> au(KU, 255);
    std::vector<int8_t> bu(KU, -128);
    kernels::gemm_u8s8s32(au.data(), KU, bu.data(), KU, &c, 1, 1, 1, KU, isa);
    EXPECT_EQ(c, -KU * 255 * 128) << kernels::isa_name(isa);
    // One more and the sum could wrap: refused (issue 12: K = 70000 wrapped silently).
    std::vector<int8_t> b1(KU + 1, -128);
    std::vector<uint8_t> a1(KU + 1, 255);
    EXPECT_THROW(
        kernels::gemm_u8s8s32(a1.data(), KU + 1, b1.data(), KU + 1, &c, 1, 1, 1, KU + 1, isa),
        ShapeError);
    std::vector<int8_t> a2(K8 + 1, 1), b2(K8 + 1, 1);
    EXPECT_THROW(
        kernels::gemm_s8s8s32(a2.data(), K8 + 1, b2.data(), K8 + 1, &c, 1, 1, 1, K8 + 1, isa),
        ShapeError);
  }
  std::vector<int8_t> w(kernels::kMaxExactKS8S8 + 1, 1);
  EXPECT_THROW(kernels::PackedWeightsS8(w.data(), kernels::kMaxExactKS8S8 + 1, 1,
                                        kernels::kMaxExactKS8S8 + 1),
               ShapeError);
}

TEST(Hardening, ConfigRejectsOutOfRangeValues) {
  const nlohmann::json j = {{"arch", "llama"},     {"vocab_size", 10}, {"d_model", 8},
                            {"n_layers", 1},       {"n_heads", 2},     {"d_ff", 16},
                            {"context_length", 32}};
  EXPECT_NO_THROW(ModelConfig::from_json(j));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"eos_id", int64_t{1000000000000}},
           {"bos_id", 10},
           {"eos_id", -2},
           {"rope_theta", std::numeric_limits<double>::infinity()},
           {"rms_eps", -1e-5},
           {"n_layers", int64_t{1000000000000}},
           {"context_length", 0}}) {
    auto bad = j;
    bad[key] = value;
    EXPECT_THROW(ModelConfig::from_json(bad), InvalidArgument) << key << "=" << value.dump();
  }
}

TEST(Hardening, PlanOptionNumbers) {
  EXPECT_DOUBLE_EQ(Plan::parse("smoothquant:alpha=.5").options["alpha"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(Plan::parse("smoothquant:alpha=5e-1").options["alpha"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(Plan::parse("smoothquant:alpha=+0.5").options["alpha"].get<double>(), 0.5);
  for (const char* bad : {"smoothquant:alpha=1e400", "smoothquant:alpha=nan",
                          "smoothquant:alpha=inf", "w8-group:group_size=99999999999999999999"})
    expect_error<InvalidArgument>([&] { Plan::parse(bad); }, "out of range");
}

TEST(Hardening, WriterUsesPidTempNamesAndRemovesStaleOnes) {
  const fs::path dir = fresh_dir("writer");
  const fs::path dest = dir / "cal.h5";
  // A temp file of a writer that died (PID 0x7fffffff does not exist), one of a live writer
  // (this process), and an unrelated hidden file.
  const fs::path stale = dir / ".cal.h5.2147483647-0badf00d.tmp";
  const fs::path live = dir / (".cal.h5." + std::to_string(::getpid()) + "-00000000.tmp");
  const fs::path other = dir / ".cal.h5.notes.tmp";
  for (const auto& p : {stale, live, other}) std::ofstream(p) << "x";
  {
    H5Writer w(dest.string());
    std::vector<fs::path> temps;
    for (const auto& e : fs::directory_iterator(dir)) temps.push_back(e.path().filename());
    EXPECT_EQ(temps.size(), 3u);  // live, other and the writer's own
    w.attr("/", "x", 1);
    w.commit();
  }
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(dest));
}

TEST(Hardening, WriterKeepsUmaskAndWritesThroughSymlinks) {
  const fs::path dir = fresh_dir("symlink");
  const mode_t old = ::umask(022);
  const fs::path target = dir / "real.h5", link = dir / "link.h5";
  fs::create_symlink(target, link);
  {
    H5Writer w(link.string());
    w.attr("/", "x", 1);
    w.commit();
  }
  ::umask(old);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_regular_file(target));
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);  // 0666 & ~022, not mkstemp's 0600
  EXPECT_EQ(H5File(link.string()).attr_int("/", "x"), 1);
  // A FIFO or a directory is not replaced by a regular file.
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_THROW(H5Writer(fifo.string()), InvalidArgument);
  EXPECT_THROW(H5Writer(dir.string()), InvalidArgument);
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_THROW(H5Writer((dir / "no" / "such" / "dir.h5").string()), InvalidArgument);
}

TEST(Hardening, ReaderChecksShapeBeforeAllocating) {
  const fs::path dir = fresh_dir("reader");
  const std::string path = (dir / "x.h5").string();
  {
    H5Writer w(path);
    std::vector<float> v(6, 1.0f);
    w.write("/a", {2, 3}, v.data());
    w.commit();
  }
  H5File f(path);
  EXPECT_EQ(f.read_f32("/a", {2, 3}).data.size(), 6u);
  EXPECT_THROW(f.read_f32("/a", {int64_t{1} << 31}), FormatError);
  EXPECT_TRUE(f.has_checksum("/a"));
}

TEST(Hardening, ModelLoadChecksLayersAndChecksums) {
  const fs::path dir = fresh_dir("model");
  const std::string good = (dir / "good.h5").string();
  write_tiny_model(good);
  EXPECT_NO_THROW(Model::load(good));
  // n_layers = 10^12 raised std::bad_alloc before: now the stored layers are counted first.
  const std::string many = (dir / "many.h5").string();
  write_tiny_model(many, int64_t{1000000000000});
  expect_error<FormatError>([&] { Model::load(many); }, "n_layers");
  // A flipped byte in a weight is a checksum failure (issue 12: 3 of 8 flips were silent).
  const std::string flipped = (dir / "flipped.h5").string();
  fs::copy_file(good, flipped);
  flip_byte_in(flipped, "/weights/layers/1/w_up");
  expect_error<FormatError>([&] { Model::load(flipped); }, "w_up");
  const std::string newer = (dir / "newer.h5").string();  // a version this socllm predates
  write_tiny_model(newer, kLayers, Model::kFormatVersion + 1);
  EXPECT_THROW(Model::load(newer), Unsupported);
}

TEST(Hardening, KvCacheServesOneCallAtATime) {
  const Engine e(load_tiny_model("engine"));
  KVCache cache = e.new_cache();
  const std::vector<int32_t> toks{1, 2, 3};
  // The hook parks the first call inside the engine (holding the cache) until the second call
  // has been refused, so the two overlap deterministically.
  static std::atomic<int> phase;
  phase = 0;
  set_interrupt_hook([]() -> bool {
    int expected = 0;
    if (phase.compare_exchange_strong(expected, 1))
      while (phase.load() != 2) std::this_thread::yield();
    return false;
  });
  std::thread first([&] { e.step(cache, toks, false, Plan{}); });
  while (phase.load() != 1) std::this_thread::yield();
  EXPECT_THROW(e.step(cache, toks, false, Plan{}), InvalidArgument);
  EXPECT_THROW(cache.clear(), InvalidArgument);
  phase = 2;
  first.join();
  set_interrupt_hook(nullptr);
  EXPECT_EQ(cache.length(), 3);
  // One call, two sequences, one cache: refused too.
  EXPECT_THROW(e.forward_hidden({&cache, &cache}, {toks, toks}, Plan{}), InvalidArgument);
  // Different caches in parallel threads are fine.
  KVCache a = e.new_cache(), b = e.new_cache();
  std::thread ta([&] { e.step(a, toks, false, Plan{}); });
  std::thread tb([&] { e.step(b, toks, false, Plan{}); });
  ta.join();
  tb.join();
  EXPECT_EQ(a.length(), 3);
  EXPECT_EQ(b.length(), 3);
}

TEST(Hardening, InterruptStopsACallAndLeavesTheCacheUsable) {
  const Engine e(load_tiny_model("interrupt"));
  KVCache cache = e.new_cache();
  const std::vector<int32_t> toks{1, 2, 3};
  set_interrupt_hook([]() -> bool { return true; });
  EXPECT_THROW(e.step(cache, toks, false, Plan{}), Interrupted);
  set_interrupt_hook(nullptr);
  EXPECT_EQ(cache.length(), 0);
  EXPECT_NO_THROW(e.step(cache, toks, false, Plan{}));
  EXPECT_EQ(cache.length(), 3);
  // A chunked prefill appends chunk by chunk: interrupted after some chunks, the cache is back
  // at the length it had before the call.
  static std::atomic<int> polls;
  polls = 0;
  set_interrupt_hook([]() -> bool { return ++polls > 60; });  // 22 polls per chunk
  const std::vector<int32_t> prompt(40, 5);
  EXPECT_THROW(e.step(cache, prompt, false, Plan::parse("fp32:chunk_len=8")), Interrupted);
  set_interrupt_hook(nullptr);
  EXPECT_GT(polls.load(), 44);  // two chunks had finished
  EXPECT_EQ(cache.length(), 3);
}

TEST(Hardening, GenerateCountsDoNotOverflow) {
  const Engine e(load_tiny_model("generate"));
  const std::vector<int32_t> prompt{1, 2};
  EXPECT_THROW(e.generate_greedy(prompt, std::numeric_limits<int64_t>::max(), {}, Plan{}),
               ContextOverflow);
  EXPECT_EQ(e.generate_greedy(prompt, kContext - 2, {}, Plan{}).size(),
            static_cast<size_t>(kContext - 2));
  EXPECT_THROW(e.generate_greedy(prompt, kContext - 1, {}, Plan{}), ContextOverflow);
  // chunk_len beyond the context is refused by every entry point, not only prefill.
  Plan p;
  p.chunk_len = 1000000;
  EXPECT_THROW(e.logits({{1, 2, 3}}, p), InvalidArgument);
}
