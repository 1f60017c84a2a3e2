/* Checks a cross runner (scripts/cross.sh check): prints the dynamic loader and C library this process
 * was given, as "loader PATH" and "libc PATH" lines from /proc/self/maps (qemu-user shows the host files
 * it mapped, after its -L prefix), then starts and joins threads and prints "threads ok".
 *
 * A runner that pairs one glibc build's ld.so with another build's libc.so.6 hangs in the first
 * pthread_create (the stack cache list of ld.so's private _rtld_global is read at the wrong offset), so
 * the paths are printed and flushed first: the caller can name the two files when the run times out. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static void* work(void* arg) {
  return arg;
}

int main(void) {
  FILE* maps = fopen("/proc/self/maps", "r");
  if (!maps) {
    perror("runner_check: /proc/self/maps");
    return 2;
  }
  char line[4096], seen_loader[4096] = "", seen_libc[4096] = "";
  while (fgets(line, sizeof line, maps)) {
    char* path = strchr(line, '/');
    if (!path) continue;
    path[strcspn(path, "\n")] = '\0';
    const char* base = strrchr(path, '/') + 1;
    if (strncmp(base, "ld-linux", 8) == 0 && strcmp(seen_loader, path) != 0) {
      snprintf(seen_loader, sizeof seen_loader, "%s", path);
      printf("loader %s\n", path);
    } else if (strcmp(base, "libc.so.6") == 0 && strcmp(seen_libc, path) != 0) {
      snprintf(seen_libc, sizeof seen_libc, "%s", path);
      printf("libc %s\n", path);
    }
  }
  fclose(maps);
  fflush(stdout);
  for (int round = 0; round < 4; round++) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
      if (pthread_create(&t[i], NULL, work, NULL) != 0) {
        fprintf(stderr, "runner_check: pthread_create failed\n");
        return 3;
      }
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  }
  printf("threads ok\n");
  return 0;
}
