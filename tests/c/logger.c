/* A C-variadic logger with the ncclDebugLogger_t signature, for tests of the logging bridge. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "swl_test.h"

#define SWL_LOG_CAP 65536

static _Thread_local char swl_buf[SWL_LOG_CAP];
static _Thread_local size_t swl_len;
static _Thread_local size_t swl_calls;

static void swl_append(const char* s, size_t n) {
  if (n > SWL_LOG_CAP - swl_len) n = SWL_LOG_CAP - swl_len;
  memcpy(swl_buf + swl_len, s, n);
  swl_len += n;
}

void swl_test_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                     ...) {
  char head[512];
  char text[4096];
  va_list ap;
  int h, t;
  swl_calls++;
  h = snprintf(head, sizeof head, "%d|%lx|%s|%d|", (int)level, flags, file ? file : "(null)", line);
  if (h < 0) return;
  va_start(ap, fmt);
  t = vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (t < 0) return;
  swl_append(head, (size_t)h < sizeof head ? (size_t)h : sizeof head - 1);
  swl_append(text, (size_t)t < sizeof text ? (size_t)t : sizeof text - 1);
  swl_append("\n", 1);
}

size_t swl_test_log_take(char* out, size_t cap) {
  size_t n = swl_len;
  memcpy(out, swl_buf, n < cap ? n : cap);
  swl_len = 0;
  swl_calls = 0;
  return n;
}

size_t swl_test_log_calls(void) { return swl_calls; }
