// One rank of the GPU self-test straight on NCCL's C API (no PyTorch in between): all_reduce,
// all_gather, reduce_scatter, alltoall, broadcast and send/recv for every size and dtype, each
// output element compared on the GPU with its exact expected value, each size timed.
//
// The inputs, expected values, sizes and bandwidth formulas are selftest.py's (the same `pattern`,
// `layout`, `bus_factor`), and the rows are the same JSON lines, so `selftest.py report` merges
// both drivers. gpu-selftest.sh builds it with nvcc against the nccl.h and libnccl.so.2 of the
// nvidia-nccl wheel that PyTorch loads, and starts one process per rank:
//
//   nccl_selftest --rank R --nranks N --id-file PATH [--device D] [--results FILE.jsonl]
//                 [--collectives LIST] [--dtypes float32,bfloat16] [--min-bytes B]
//                 [--max-bytes B] [--iters N] [--bytes-per-size B]
//
// Rank 0 writes its ncclUniqueId to PATH (a temporary file, then rename); the others wait for it
// (60 s). Without a GPU (CI), the host code builds with g++ against the stub headers in stub/
// (`-Istub`): there, `--print-pattern` and `--print-expected` print the values the kernels use,
// which test_selftest.py compares with selftest.py's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__CUDACC__)
#define LAUNCH(kernel, n, stream, ...) kernel<<<blocks_for(n), 256, 0, stream>>>(__VA_ARGS__)
#else
// Host-only build (stub headers): a kernel is a plain function whose grid-stride loop covers all.
#define LAUNCH(kernel, n, stream, ...) kernel(__VA_ARGS__)
#endif

#define CUDACHECK(cmd)                                                                         \
  do {                                                                                         \
    cudaError_t e_ = (cmd);                                                                    \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "nccl_selftest: %s:%d: %s: %s\n", __FILE__, __LINE__, #cmd,              \
              cudaGetErrorString(e_));                                                         \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define NCCLCHECK(cmd)                                                                         \
  do {                                                                                         \
    ncclResult_t r_ = (cmd);                                                                   \
    if (r_ != ncclSuccess) {                                                                   \
      fprintf(stderr, "nccl_selftest: %s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #cmd,         \
              ncclGetErrorString(r_), g_comm ? ncclGetLastError(g_comm) : "no communicator"); \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

static ncclComm_t g_comm = NULL;

enum Coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALLTOALL, BROADCAST, SENDRECV, NCOLL };
static const char* kCollNames[NCOLL] = {"all_reduce", "all_gather", "reduce_scatter",
                                        "alltoall",   "broadcast",  "sendrecv"};
enum Dtype { FLOAT32, BFLOAT16, NDTYPE };
static const char* kDtypeNames[NDTYPE] = {"float32", "bfloat16"};
static const size_t kDtypeSize[NDTYPE] = {4, 2};

static constexpr int kRoot = 0;
static constexpr int kSentinel = -1024;  // never a pattern value; exact in bfloat16
static constexpr int kPatternHalf = 30;
static constexpr int kMaxRanks = 8;  // n * 30 <= 256: bfloat16 sums stay exact

// selftest.py `pattern`: an integer in [-30, 30].
__host__ __device__ inline int pattern(int rank, unsigned long long i) {
  return (int)((i * 7919ULL + (i / 61ULL) * 31ULL + (unsigned long long)rank * 17ULL) % 61ULL) -
         kPatternHalf;
}

// A rank's input element i before the operation (selftest.py `input_values`).
__host__ __device__ inline int input_value(int coll, int rank, unsigned long long i) {
  if (coll == BROADCAST) return rank == kRoot ? pattern(kRoot, i) : kSentinel;
  return pattern(rank, i);
}

// What output element j must hold after the operation (selftest.py `expected_values`).
__host__ __device__ inline int expected_value(int coll, int rank, int nranks,
                                              unsigned long long count, unsigned long long j) {
  int s = 0;
  switch (coll) {
    case ALL_REDUCE:
      for (int q = 0; q < nranks; q++) s += pattern(q, j);
      return s;
    case ALL_GATHER:
      return pattern((int)(j / count), j % count);
    case REDUCE_SCATTER:
      for (int q = 0; q < nranks; q++) s += pattern(q, (unsigned long long)rank * count + j);
      return s;
    case ALLTOALL:
      return pattern((int)(j / count), (unsigned long long)rank * count + j % count);
    case BROADCAST:
      return pattern(kRoot, j);
    default:  // SENDRECV: from rank - 1 (ring)
      return pattern((rank - 1 + nranks) % nranks, j);
  }
}

__host__ __device__ inline float to_float(float v) { return v; }
__host__ __device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__host__ __device__ inline void from_int(float* p, int v) { *p = (float)v; }
__host__ __device__ inline void from_int(__nv_bfloat16* p, int v) { *p = __float2bfloat16((float)v); }

template <typename T>
__global__ void fill_input(T* buf, unsigned long long n, int coll, int rank) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x)
    from_int(&buf[i], input_value(coll, rank, i));
}

template <typename T>
__global__ void fill_value(T* buf, unsigned long long n, int v) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x)
    from_int(&buf[i], v);
}

// Counts the output elements that differ from their expected value (exact comparison: every
// value involved is an integer the type holds exactly).
template <typename T>
__global__ void count_wrong(const T* out, unsigned long long n, int coll, int rank, int nranks,
                            unsigned long long count, unsigned long long* wrong) {
  unsigned long long mine = 0;
  for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; j < n;
       j += (unsigned long long)blockDim.x * gridDim.x)
    if (to_float(out[j]) != (float)expected_value(coll, rank, nranks, count, j)) mine++;
  if (mine) atomicAdd(wrong, mine);
}

__attribute__((unused)) static unsigned blocks_for(unsigned long long n) {
  unsigned long long b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : (b > 2048 ? 2048 : b));
}

// selftest.py `layout`: count, input and output elements, reported bytes.
static void layout(int coll, size_t size, size_t elt, int nranks, size_t* count, size_t* n_in,
                   size_t* n_out, size_t* moved) {
  size_t total = size / elt ? size / elt : 1;
  if (coll == ALL_GATHER || coll == REDUCE_SCATTER || coll == ALLTOALL) {
    *count = total / nranks ? total / nranks : 1;
    *n_in = coll == ALL_GATHER ? *count : *count * nranks;
    *n_out = coll == REDUCE_SCATTER ? *count : *count * nranks;
    *moved = *count * nranks * elt;
  } else {
    *count = *n_in = *n_out = total;
    *moved = total * elt;
  }
}

// nccl-tests' busbw / algbw (NVIDIA/nccl-tests v2.19.6, src/<coll>.cu, <Coll>GetBw).
static double bus_factor(int coll, int n) {
  if (coll == ALL_REDUCE) return 2.0 * (n - 1) / n;
  if (coll == ALL_GATHER || coll == REDUCE_SCATTER || coll == ALLTOALL) return (double)(n - 1) / n;
  return 1.0;
}

static size_t iters_for(size_t size, size_t iters, size_t bytes_per_size) {
  size_t by_bytes = bytes_per_size / (size ? size : 1);
  size_t it = iters < by_bytes ? iters : by_bytes;
  return it < 2 ? 2 : it;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char* s) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) {
    fprintf(stderr, "nccl_selftest: size '%s': use 8, 64K, 256M or 1G\n", s);
    exit(2);
  }
  switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    default: break;
  }
  if (*end == 'B') end++;
  if (*end) {
    fprintf(stderr, "nccl_selftest: size '%s': use 8, 64K, 256M or 1G\n", s);
    exit(2);
  }
  return (size_t)v;
}

// Comma-separated names -> flags; exits naming what is accepted.
static void parse_list(const char* text, const char* const* names, int n, int* on) {
  for (int i = 0; i < n; i++) on[i] = 0;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", text);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int found = 0;
    for (int i = 0; i < n; i++)
      if (!strcmp(tok, names[i])) on[i] = found = 1;
    if (!found) {
      fprintf(stderr, "nccl_selftest: unknown name '%s' (accepted:", tok);
      for (int i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
      fprintf(stderr, ")\n");
      exit(2);
    }
  }
}

static int coll_index(const char* name) {
  for (int c = 0; c < NCOLL; c++)
    if (!strcmp(name, kCollNames[c])) return c;
  fprintf(stderr, "nccl_selftest: unknown collective '%s'\n", name);
  exit(2);
}

static void exchange_id(int rank, const char* path, ncclUniqueId* id) {
  if (rank == 0) {
    NCCLCHECK(ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "nccl_selftest: writing %s: %s\n", path, strerror(errno));
      exit(1);
    }
    return;
  }
  for (int tries = 0; tries < 600; tries++) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof(*id), 1, f);
      fclose(f);
      if (got == 1) return;
    }
    usleep(100 * 1000);
  }
  fprintf(stderr, "nccl_selftest: rank %d: no ncclUniqueId in %s after 60 s (did rank 0 start?)\n",
          rank, path);
  exit(1);
}

struct Opts {
  int rank, nranks, device;
  const char* id_file;
  const char* results;
  int colls[NCOLL];
  int dtypes[NDTYPE];
  size_t min_bytes, max_bytes, iters, bytes_per_size;
};

static void run_op(int coll, const void* in, void* out, size_t count, ncclDataType_t t,
                   size_t elt, const Opts& o, cudaStream_t s) {
  int next = (o.rank + 1) % o.nranks, prev = (o.rank - 1 + o.nranks) % o.nranks;
  switch (coll) {
    case ALL_REDUCE:
      NCCLCHECK(ncclAllReduce(in, out, count, t, ncclSum, g_comm, s));
      break;
    case ALL_GATHER:
      NCCLCHECK(ncclAllGather(in, out, count, t, g_comm, s));
      break;
    case REDUCE_SCATTER:
      NCCLCHECK(ncclReduceScatter(in, out, count, t, ncclSum, g_comm, s));
      break;
    case ALLTOALL:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      NCCLCHECK(ncclAlltoAll(in, out, count, t, g_comm, s));
#else
      NCCLCHECK(ncclGroupStart());
      for (int p = 0; p < o.nranks; p++) {
        NCCLCHECK(ncclSend((const char*)in + p * count * elt, count, t, p, g_comm, s));
        NCCLCHECK(ncclRecv((char*)out + p * count * elt, count, t, p, g_comm, s));
      }
      NCCLCHECK(ncclGroupEnd());
#endif
      break;
    case BROADCAST:
      NCCLCHECK(ncclBroadcast(in, out, count, t, kRoot, g_comm, s));
      break;
    default:
      NCCLCHECK(ncclGroupStart());
      NCCLCHECK(ncclSend(in, count, t, next, g_comm, s));
      NCCLCHECK(ncclRecv(out, count, t, prev, g_comm, s));
      NCCLCHECK(ncclGroupEnd());
      break;
  }
  (void)elt;
}

template <typename T>
static unsigned long long prepare_and_check(int coll, T* in, T* out, size_t n_in, size_t n_out,
                                            size_t count, ncclDataType_t t, const Opts& o,
                                            cudaStream_t s, unsigned long long* d_wrong) {
  LAUNCH(fill_input<T>, n_in, s, in, (unsigned long long)n_in, coll, o.rank);
  LAUNCH(fill_value<T>, n_out, s, out, (unsigned long long)n_out, kSentinel);
  CUDACHECK(cudaGetLastError());
  run_op(coll, in, out, count, t, sizeof(T), o, s);
  CUDACHECK(cudaMemsetAsync(d_wrong, 0, sizeof(*d_wrong), s));
  LAUNCH(count_wrong<T>, n_out, s, out, (unsigned long long)n_out, coll, o.rank, o.nranks,
         (unsigned long long)count, d_wrong);
  CUDACHECK(cudaGetLastError());
  unsigned long long wrong = 0;
  CUDACHECK(cudaMemcpyAsync(&wrong, d_wrong, sizeof(wrong), cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaStreamSynchronize(s));
  return wrong;
}

template <typename T>
static void run_size(int coll, int dt, size_t size, void* d_in, void* d_out, const Opts& o,
                     cudaStream_t s, unsigned long long* d_wrong, double* d_avg,
                     unsigned long long* d_sum, FILE* results) {
  ncclDataType_t t = dt == FLOAT32 ? ncclFloat32 : ncclBfloat16;
  size_t count, n_in, n_out, moved;
  layout(coll, size, sizeof(T), o.nranks, &count, &n_in, &n_out, &moved);
  T* in = (T*)d_in;
  T* out = (T*)d_out;
  // checked before and after the timed loop, each from fresh buffers
  unsigned long long wrong = prepare_and_check(coll, in, out, n_in, n_out, count, t, o, s, d_wrong);
  size_t iters = iters_for(moved, o.iters, o.bytes_per_size);
  double t0 = now_s();
  for (size_t k = 0; k < iters; k++) run_op(coll, in, out, count, t, sizeof(T), o, s);
  CUDACHECK(cudaStreamSynchronize(s));
  double sec = (now_s() - t0) / iters;
  wrong += prepare_and_check(coll, in, out, n_in, n_out, count, t, o, s, d_wrong);
  // average time and total wrong elements over the ranks, as nccl-tests reports them
  CUDACHECK(cudaMemcpyAsync(d_avg, &sec, sizeof(sec), cudaMemcpyHostToDevice, s));
  CUDACHECK(cudaMemcpyAsync(d_sum, &wrong, sizeof(wrong), cudaMemcpyHostToDevice, s));
  NCCLCHECK(ncclAllReduce(d_avg, d_avg, 1, ncclFloat64, ncclSum, g_comm, s));
  NCCLCHECK(ncclAllReduce(d_sum, d_sum, 1, ncclUint64, ncclSum, g_comm, s));
  CUDACHECK(cudaMemcpyAsync(&sec, d_avg, sizeof(sec), cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaMemcpyAsync(&wrong, d_sum, sizeof(wrong), cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaStreamSynchronize(s));
  sec /= o.nranks;
  if (o.rank != 0) return;
  double alg = sec > 0 ? moved / 1e9 / sec : 0, bus = alg * bus_factor(coll, o.nranks);
  printf("%-6s %-14s %-8s %12zu %10zu %5zu %11.1f %10.3f %10.3f %10.3f %10.3f %8llu\n", "c",
         kCollNames[coll], kDtypeNames[dt], moved, count, iters, sec * 1e6, alg, alg * 8, bus,
         bus * 8, wrong);
  fflush(stdout);
  if (results) {
    fprintf(results,
            "{\"driver\": \"c\", \"coll\": \"%s\", \"dtype\": \"%s\", \"size\": %zu, \"count\": %zu, "
            "\"nranks\": %d, \"iters\": %zu, \"time_us\": %.3f, \"algbw_gbyte_s\": %.6f, "
            "\"busbw_gbyte_s\": %.6f, \"wrong\": %llu}\n",
            kCollNames[coll], kDtypeNames[dt], moved, count, o.nranks, iters, sec * 1e6, alg, bus,
            wrong);
    fflush(results);
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: nccl_selftest --rank R --nranks N --id-file PATH [--device D] [--results F]\n"
          "         [--collectives LIST] [--dtypes LIST] [--min-bytes B] [--max-bytes B]\n"
          "         [--iters N] [--bytes-per-size B]\n"
          "       nccl_selftest --print-pattern RANK START COUNT\n"
          "       nccl_selftest --print-expected COLL RANK NRANKS COUNT\n");
}

int main(int argc, char** argv) {
  // Host-side checks (no GPU needed): the values the kernels compute.
  if (argc == 5 && !strcmp(argv[1], "--print-pattern")) {
    int r = atoi(argv[2]);
    unsigned long long start = strtoull(argv[3], NULL, 10), n = strtoull(argv[4], NULL, 10);
    for (unsigned long long i = 0; i < n; i++) printf("%d%c", pattern(r, start + i), i + 1 < n ? ' ' : '\n');
    return 0;
  }
  if (argc == 6 && !strcmp(argv[1], "--print-expected")) {
    int c = coll_index(argv[2]), r = atoi(argv[3]), n = atoi(argv[4]);
    size_t count = strtoull(argv[5], NULL, 10);
    size_t n_in = (c == REDUCE_SCATTER || c == ALLTOALL) ? count * n : count;
    size_t n_out = (c == ALL_GATHER || c == ALLTOALL) ? count * n : count;
    printf("input");
    for (size_t i = 0; i < n_in; i++) printf(" %d", input_value(c, r, i));
    printf("\nexpected");
    for (size_t j = 0; j < n_out; j++) printf(" %d", expected_value(c, r, n, count, j));
    printf("\n");
    return 0;
  }

  Opts o;
  memset(&o, 0, sizeof(o));
  o.rank = -1;
  o.nranks = 2;
  o.min_bytes = 8;
  o.max_bytes = 256u << 20;
  o.iters = 10;
  o.bytes_per_size = 512u << 20;
  for (int c = 0; c < NCOLL; c++) o.colls[c] = 1;
  for (int d = 0; d < NDTYPE; d++) o.dtypes[d] = 1;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      usage();
      return 2;
    }
    if (!strcmp(a, "--rank")) o.rank = atoi(v);
    else if (!strcmp(a, "--nranks")) o.nranks = atoi(v);
    else if (!strcmp(a, "--device")) o.device = atoi(v);
    else if (!strcmp(a, "--id-file")) o.id_file = v;
    else if (!strcmp(a, "--results")) o.results = v;
    else if (!strcmp(a, "--collectives")) parse_list(v, kCollNames, NCOLL, o.colls);
    else if (!strcmp(a, "--dtypes")) parse_list(v, kDtypeNames, NDTYPE, o.dtypes);
    else if (!strcmp(a, "--min-bytes")) o.min_bytes = parse_size(v);
    else if (!strcmp(a, "--max-bytes")) o.max_bytes = parse_size(v);
    else if (!strcmp(a, "--iters")) o.iters = parse_size(v);
    else if (!strcmp(a, "--bytes-per-size")) o.bytes_per_size = parse_size(v);
    else {
      fprintf(stderr, "nccl_selftest: unknown option '%s'\n", a);
      usage();
      return 2;
    }
    i++;
  }
  if (o.rank < 0 || o.rank >= o.nranks || o.nranks < 2 || o.nranks > kMaxRanks || !o.id_file ||
      o.min_bytes < 1 || o.max_bytes < o.min_bytes || o.iters < 1) {
    fprintf(stderr, "nccl_selftest: need --rank in [0, nranks), --nranks 2..%d, --id-file, "
                    "1 <= min-bytes <= max-bytes, iters >= 1\n", kMaxRanks);
    return 2;
  }

  CUDACHECK(cudaSetDevice(o.device));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreate(&s));
  ncclUniqueId id;
  exchange_id(o.rank, o.id_file, &id);
  double t0 = now_s();
  NCCLCHECK(ncclCommInitRank(&g_comm, o.nranks, id, o.rank));
  int ver = 0;
  NCCLCHECK(ncclGetVersion(&ver));
  cudaDeviceProp prop;
  CUDACHECK(cudaGetDeviceProperties(&prop, o.device));
  if (o.rank == 0) {
    printf("nccl_selftest: %d ranks, NCCL %d.%d.%d (built against %d), %s; init %.1f s\n", o.nranks,
           ver / 10000, ver / 100 % 100, ver % 100, NCCL_VERSION_CODE, prop.name, now_s() - t0);
    printf("%-6s %-14s %-8s %12s %10s %5s %11s %10s %10s %10s %10s %8s\n", "driver", "collective",
           "type", "size", "count", "iters", "time us", "algbw GB/s", "algbw Gb/s", "busbw GB/s",
           "busbw Gb/s", "#wrong");
    fflush(stdout);
  }

  size_t buf_bytes = o.max_bytes + 64;
  void *d_in, *d_out;
  unsigned long long *d_wrong, *d_sum;
  double* d_avg;
  CUDACHECK(cudaMalloc(&d_in, buf_bytes));
  CUDACHECK(cudaMalloc(&d_out, buf_bytes));
  CUDACHECK(cudaMalloc((void**)&d_wrong, sizeof(*d_wrong)));
  CUDACHECK(cudaMalloc((void**)&d_sum, sizeof(*d_sum)));
  CUDACHECK(cudaMalloc((void**)&d_avg, sizeof(*d_avg)));
  FILE* results = NULL;
  if (o.rank == 0 && o.results) {
    results = fopen(o.results, "a");
    if (!results) {
      fprintf(stderr, "nccl_selftest: opening %s: %s\n", o.results, strerror(errno));
      return 1;
    }
  }
  for (int dt = 0; dt < NDTYPE; dt++) {
    if (!o.dtypes[dt]) continue;
    for (int c = 0; c < NCOLL; c++) {
      if (!o.colls[c]) continue;
      for (size_t size = o.min_bytes; size <= o.max_bytes; size *= 2) {
        if (dt == FLOAT32)
          run_size<float>(c, dt, size, d_in, d_out, o, s, d_wrong, d_avg, d_sum, results);
        else
          run_size<__nv_bfloat16>(c, dt, size, d_in, d_out, o, s, d_wrong, d_avg, d_sum, results);
      }
    }
  }
  if (results) fclose(results);
  CUDACHECK(cudaStreamSynchronize(s));
  NCCLCHECK(ncclCommFinalize(g_comm));
  NCCLCHECK(ncclCommDestroy(g_comm));
  g_comm = NULL;
  CUDACHECK(cudaFree(d_in));
  CUDACHECK(cudaFree(d_out));
  CUDACHECK(cudaFree(d_wrong));
  CUDACHECK(cudaFree(d_sum));
  CUDACHECK(cudaFree(d_avg));
  return 0;
}
