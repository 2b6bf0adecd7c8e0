// KB_CHECK(cond, printf format, args...): TORCH_CHECK with the message formatted into a buffer first.
// Why: on the device image (torch 2.11+cu130) a failing TORCH_CHECK whose message was built from several arguments
// (c10::str into a std::string) crashed the process with a segmentation fault (moe's weight check, 2026-11-25),
// where a failing check with a single const char* message raised RuntimeError as it should. The cause was not
// pinned down (a std::string crossing into libc10 is the suspect); this keeps bad input a one-line error.
#pragma once
#include <torch/extension.h>

#include <cstdio>

#define KB_CHECK(cond, ...)                                            \
  do {                                                                 \
    if (!(cond)) {                                                     \
      char kb_check_msg_[512];                                         \
      std::snprintf(kb_check_msg_, sizeof kb_check_msg_, __VA_ARGS__); \
      TORCH_CHECK(false, static_cast<const char*>(kb_check_msg_));     \
    }                                                                  \
  } while (0)
