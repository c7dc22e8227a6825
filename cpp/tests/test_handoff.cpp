// Thread handoffs (handoff.h): every waiting method completes each handoff and never sees the
// flag before the device raised it; the device's work bounds each wait from below; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/core.h"
#include "core/handoff.h"

namespace {

TEST(Handoff, EveryMethodHandsOverEveryItemInOrder) {
  for (const auto& name : socllm::wait_method_names()) {
    socllm::HandoffOptions o;
    o.method = socllm::wait_method_from_name(name);
    EXPECT_EQ(socllm::wait_method_name(o.method), name);
    o.iterations = 40;
    o.warmup = 2;
    o.work_us = 30.0;
    o.sleep_margin_us = 10.0;
    const auto r = socllm::measure_handoff(o);
    ASSERT_EQ(r.latency_us.size(), 40u) << name;
    ASSERT_EQ(r.waiter_cpu_us.size(), 40u) << name;
    for (size_t i = 0; i < r.wait_us.size(); ++i) {
      EXPECT_GE(r.latency_us[i], 0.0) << name;     // seen after it was raised
      EXPECT_GE(r.wait_us[i], o.work_us) << name;  // the device worked before raising it
      EXPECT_GE(r.waiter_cpu_us[i], 0.0) << name;
      EXPECT_LE(r.latency_us[i], r.wait_us[i]) << name;
    }
  }
}

TEST(Handoff, BadInput) {
  socllm::HandoffOptions o;
  o.iterations = 0;
  EXPECT_THROW(socllm::measure_handoff(o), socllm::InvalidArgument);
  o.iterations = 1;
  o.work_us = -1.0;
  EXPECT_THROW(socllm::measure_handoff(o), socllm::InvalidArgument);
  o.work_us = 1.0;
  o.sleep_margin_us = std::nan("");
  EXPECT_THROW(socllm::measure_handoff(o), socllm::InvalidArgument);
  o.sleep_margin_us = 1.0;
  o.warmup = -1;
  EXPECT_THROW(socllm::measure_handoff(o), socllm::InvalidArgument);
  EXPECT_THROW(socllm::wait_method_from_name("semaphore"), socllm::InvalidArgument);
}

}  // namespace
