// The calibration artifact: schema defined in calibration.h, written and read through the io
// layer's HDF5 writer/reader (model_store.h).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "calibration/calibration.h"
#include "core/core.h"
#include "io/model_store.h"

using namespace socllm;

namespace {

ModelConfig tiny(int64_t d_model = 8) {
  return ModelConfig::from_json({{"arch", "llama"},
                                 {"name", "tiny"},
                                 {"vocab_size", 10},
                                 {"d_model", d_model},
                                 {"n_layers", 2},
                                 {"n_heads", 2},
                                 {"n_kv_heads", 1},
                                 {"d_ff", 16},
                                 {"context_length", 64}});
}

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

Calibration observed(const ModelConfig& c) {
  Calibration cal = Calibration::empty_for(c);
  std::vector<float> x(3 * c.d_model);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i) - 1.0f;
  for (int64_t l = 0; l < c.n_layers; ++l)
    cal.observe(l, LinearSite::AttnIn, x.data(), 3, c.d_model);
  cal.tokens = 3;
  return cal;
}

}  // namespace

TEST(CalibrationStore, RoundTripsWithProvenance) {
  const ModelConfig c = tiny();
  Calibration cal = observed(c);
  const std::string path = tmp("socllm_cal_rt.h5");
  cal.save(path, c, {{"corpus", "wikitext2"}, {"samples", 4}, {"budget", 0.01}});
  nlohmann::json prov;
  const Calibration back = Calibration::load(path, c, &prov);
  EXPECT_EQ(back.channel_absmax[0], cal.channel_absmax[0]);
  EXPECT_EQ(back.abs_hist[0], cal.abs_hist[0]);
  EXPECT_EQ(back.tokens, 3);
  EXPECT_TRUE(back.outlier_threshold[0].empty());
  EXPECT_EQ(prov["corpus"], "wikitext2");
  EXPECT_EQ(prov["samples"], 4);
  EXPECT_DOUBLE_EQ(prov["budget"].get<double>(), 0.01);
  EXPECT_EQ(prov["format_version"], Calibration::kFormatVersion);
  // outlier statistics round-trip too, with the defaults' group for inspection
  const std::vector<float> t(2, 0.5f);
  for (int s = 0; s < kNumLinearSites; ++s)
    cal.set_outlier_thresholds(static_cast<LinearSite>(s), t);
  cal.save(path, c, nlohmann::json::object());
  const Calibration with = Calibration::load(path, c);
  EXPECT_EQ(with.outlier_threshold[1], t);
  EXPECT_TRUE(with.has_outlier_stats());
  H5File f(path);
  EXPECT_TRUE(f.has("/shadow_defaults/pruned"));
  EXPECT_EQ(f.shape("/act_absmax/mlp_act"), (std::vector<int64_t>{2, 16}));
  std::remove(path.c_str());
}

TEST(CalibrationStore, RefusesOtherModelsVersionsAndBadFiles) {
  const ModelConfig c = tiny();
  const std::string path = tmp("socllm_cal_bad.h5");
  observed(c).save(path, c, nlohmann::json::object());
  try {
    Calibration::load(path, tiny(16));
    FAIL() << "another model's file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("d_model 8"), std::string::npos) << e.what();
  }
  // another schema version
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    const int64_t v = 2;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
  }
  try {
    Calibration::load(path, c);
    FAIL() << "an old schema version was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("schema version 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Calibration::load(tmp("socllm_no_such_cal.h5"), c), MissingFile);
  // not HDF5 at all
  FILE* g = std::fopen(path.c_str(), "w");
  std::fputs("not hdf5", g);
  std::fclose(g);
  EXPECT_THROW(Calibration::load(path, c), FormatError);
  std::remove(path.c_str());
}

TEST(CalibrationStore, WriterIsAtomicAndKeepsTheUmask) {
  const std::string path = tmp("socllm_atomic.h5");
  std::remove(path.c_str());
  const mode_t old = ::umask(022);
  {
    H5Writer w(path);
    const float x[2] = {1, 2};
    w.write("/a/b", {2}, x);
    // destroyed without commit: nothing at `path`, no temporary left
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    H5Writer w(path);
    const int64_t x[3] = {1, 2, 3};
    w.write("/x", {3}, x);
    w.attr("/", "k", "v");
    w.commit();
  }
  ::umask(old);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  H5File f(path);
  EXPECT_EQ(f.read_i64("/x"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.attr_json("/", "k"), "v");
  EXPECT_EQ(f.attr_names("/"), (std::vector<std::string>{kAttributesChecksum, "k"}));
  // The checksum covers the canonical text (docs/MODEL_FORMAT.md): path, then name NUL value.
  const std::string text = std::string("/\nk") + '\0' + "s:v\n";
  EXPECT_EQ(f.canonical_attributes("/"), text);
  EXPECT_EQ(f.attr_int("/", kAttributesChecksum),
            static_cast<int64_t>(crc32(0L, reinterpret_cast<const Bytef*>(text.data()),
                                       static_cast<uInt>(text.size()))));
  EXPECT_EQ(f.canonical_attributes("/x"), "");  // no attributes: nothing to cover
  EXPECT_EQ(f.verify_attributes(true), 1);
  std::remove(path.c_str());
}

TEST(CalibrationStore, ChangedAttributeFailsItsChecksum) {
  const std::string path = tmp("socllm_attr_crc.h5");
  {
    H5Writer w(path);
    w.group("/g");
    w.attr("/g", "scale", 0.125);
    w.attr("/g", "n", 3);
    w.commit();
  }
  {
    H5File f(path);
    std::string want = std::string("/g\nn") + '\0' + "i:3\nscale" + '\0' + "f:3fc0000000000000\n";
    EXPECT_EQ(f.canonical_attributes("/g"), want);
    EXPECT_EQ(f.verify_attributes(true), 1);
  }
  // Rewrite one value behind the writer's back, as a flipped bit would.
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t g = H5Gopen2(file, "/g", H5P_DEFAULT);
  ASSERT_GE(H5Adelete(g, "scale"), 0);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(g, "scale", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  const double other = 0.125000000001;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_DOUBLE, &other), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Gclose(g);
  H5Fclose(file);
  try {
    H5File(path).verify_attributes(true);
    ADD_FAILURE() << "no FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'/g' in '" + path + "'"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(CalibrationStore, ArrayValuedAttributesAreFormatErrors) {
  // issue 12: a config attribute stored as an array overflowed the scalar reader
  const std::string path = tmp("socllm_attr_array.h5");
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t n = 100;
  hid_t sp = H5Screate_simple(1, &n, nullptr);
  hid_t a = H5Acreate2(f, "n_layers", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  std::vector<int64_t> v(100, 7);
  H5Awrite(a, H5T_NATIVE_INT64, v.data());
  H5Aclose(a);
  H5Sclose(sp);
  H5Fclose(f);
  H5File h(path);
  try {
    h.attr_int("/", "n_layers");
    FAIL() << "array attribute read as a scalar";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(h.attr_float("/", "n_layers"), FormatError);
  std::remove(path.c_str());
}
