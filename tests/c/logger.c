/* A C-variadic logger with the ncclDebugLogger_t signature, for tests of the logging bridge. */
#include <pthread.h>
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

/* Formats one call as "level|flags|file|line|text\n" into out (at most cap bytes); returns the length, or
 * 0 when formatting failed. */
static size_t swl_format(char* out, size_t cap, ncclDebugLogLevel level, unsigned long flags, const char* file,
                         int line, const char* fmt, va_list ap) {
  char text[4096];
  int h, t;
  size_t n;
  h = snprintf(out, cap, "%d|%lx|%s|%d|", (int)level, flags, file ? file : "(null)", line);
  if (h < 0 || (size_t)h >= cap) return 0;
  t = vsnprintf(text, sizeof text, fmt, ap);
  if (t < 0) return 0;
  n = (size_t)t < sizeof text ? (size_t)t : sizeof text - 1;
  if ((size_t)h + n + 1 > cap) n = cap - (size_t)h - 1;
  memcpy(out + h, text, n);
  out[(size_t)h + n] = '\n';
  return (size_t)h + n + 1;
}

void swl_test_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                     ...) {
  char buf[512 + 4096 + 1];
  va_list ap;
  size_t n;
  swl_calls++;
  va_start(ap, fmt);
  n = swl_format(buf, sizeof buf, level, flags, file, line, fmt, ap);
  va_end(ap);
  swl_append(buf, n);
}

#define SWL_SHARED_LOG_CAP (1u << 20)

static pthread_mutex_t swl_shared_lock = PTHREAD_MUTEX_INITIALIZER;
static char swl_shared_buf[SWL_SHARED_LOG_CAP];
static size_t swl_shared_len;
static size_t swl_shared_dropped;

void swl_shared_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                       const char* fmt, ...) {
  char buf[512 + 4096 + 1];
  va_list ap;
  size_t n;
  va_start(ap, fmt);
  n = swl_format(buf, sizeof buf, level, flags, file, line, fmt, ap);
  va_end(ap);
  if (n == 0) return;
  pthread_mutex_lock(&swl_shared_lock);
  if (n <= SWL_SHARED_LOG_CAP - swl_shared_len) {
    memcpy(swl_shared_buf + swl_shared_len, buf, n);
    swl_shared_len += n;
  } else {
    swl_shared_dropped++;
  }
  pthread_mutex_unlock(&swl_shared_lock);
}

size_t swl_shared_log_pending(void) {
  size_t n;
  pthread_mutex_lock(&swl_shared_lock);
  n = swl_shared_len;
  pthread_mutex_unlock(&swl_shared_lock);
  return n;
}

size_t swl_shared_log_take(char* out, size_t cap, size_t* dropped) {
  size_t n;
  pthread_mutex_lock(&swl_shared_lock);
  n = swl_shared_len < cap ? swl_shared_len : cap;
  /* Whole lines only: the rest stays for the next take. */
  while (n > 0 && n < swl_shared_len && swl_shared_buf[n - 1] != '\n') n--;
  memcpy(out, swl_shared_buf, n);
  memmove(swl_shared_buf, swl_shared_buf + n, swl_shared_len - n);
  swl_shared_len -= n;
  if (dropped) *dropped = swl_shared_dropped;
  swl_shared_dropped = 0;
  pthread_mutex_unlock(&swl_shared_lock);
  return n;
}

size_t swl_test_log_take(char* out, size_t cap) {
  size_t n = swl_len;
  memcpy(out, swl_buf, n < cap ? n : cap);
  swl_len = 0;
  swl_calls = 0;
  return n;
}

size_t swl_test_log_calls(void) { return swl_calls; }
