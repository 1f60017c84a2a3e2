/* Test helpers compiled by build.rs (see tests/c/logger.c and tests/c/layout.c). Not part of the plugin. */
#ifndef SWL_TEST_H
#define SWL_TEST_H

#include <stddef.h>

#include "nccl_net_switchless.h"
#include "nccl_tuner_switchless.h"

/* A real C-variadic ncclDebugLogger_t. Each call appends one line "level|flags(hex)|file|line|text\n" to a
 * per-thread buffer (text = vsnprintf(fmt, args)); tests on parallel threads do not see each other's lines. */
void swl_test_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                     ...);
/* Copies the calling thread's captured text (not NUL-terminated) into out (at most cap bytes) and returns
 * the length of the captured text; then clears it. */
size_t swl_test_log_take(char* out, size_t cap);
/* Number of logger calls on the calling thread since the last take. */
size_t swl_test_log_calls(void);

/* The same logger with one process-wide buffer (locked), for a host that prints every plugin line
 * whatever thread logged it (switchless bench: the plugin's TCP I/O threads log too). The buffer
 * holds SWL_SHARED_LOG_CAP bytes; lines that do not fit are counted, not kept. */
void swl_shared_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                       const char* fmt, ...);
/* Bytes waiting in the process-wide buffer (cheap: a host may ask after every call). */
size_t swl_shared_log_pending(void);
/* Moves at most cap bytes of whole lines out of the process-wide buffer into out and returns how many;
 * *dropped gets the number of lines lost since the last take (the buffer was full). */
size_t swl_shared_log_take(char* out, size_t cap, size_t* dropped);

/* Layout table: one row per struct (field = "") and one per field, as computed by the C compiler. */
struct swl_layout_row {
  const char* ty;
  const char* field;
  size_t size;
  size_t align;
  size_t offset;
};
size_t swl_layout_count(void);
const struct swl_layout_row* swl_layout_rows(void);

#endif
