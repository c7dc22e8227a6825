// Test helper: an expected typed error whose message names the offending value.
#pragma once

#include <gtest/gtest.h>

#include <string>

// Runs f and expects it to throw E with `needle` in the message.
template <typename E, typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
