/*
 * nccl_tuner_switchless.h: the ncclTuner plugin ABI, versions 1 through 6, as the switchless library sees it.
 *
 * Written for this project from NCCL's headers read at their tags: type names, field order and constants
 * follow NCCL's (src/include/nccl_tuner.h of v2.19.4-1 and v2.20.5-1 for v1; src/include/plugin/tuner/
 * tuner_v2.h ... tuner_v6.h and src/include/plugin/nccl_tuner.h of v2.30.7-1 for v2..v6) so that a C reader
 * can compare them. Do not include this header together with NCCL's own plugin headers: the names are the
 * same on purpose.
 *
 * build.rs feeds this file (after nccl_net_switchless.h, which defines ncclResult_t and the logger) to
 * bindgen and compiles it into the layout test helper, so the C compiler and Rust agree on every size and
 * offset; tests/fixtures/nccl-abi/nccl-tuner.tsv holds the layout the C compiler computed from NCCL's own
 * headers.
 */
#ifndef NCCL_TUNER_SWITCHLESS_H
#define NCCL_TUNER_SWITCHLESS_H

#include <stddef.h>
#include <stdint.h>

#include "nccl_net_switchless.h"

/* ---------------------------------------------------------------------------------------------------------
 * Collective types (NCCL's ncclFunc_t, nccl_common.h). The values below are stable from 2.19 to 2.30; later
 * releases append (2.30 ends at ncclFuncWaitSignal = 14). Crosses the ABI as a C enum (4 bytes).
 * ------------------------------------------------------------------------------------------------------- */
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7
} ncclFunc_t;

/* Algorithm and protocol indices of the cost table (src/include/plugin/nccl_tuner.h). NCCL 2.19-2.22 have
 * 6 algorithms (no PAT); 2.23+ have 7. The table has numAlgo x numProto floats. */
#define NCCL_ALGO_UNDEF -1
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6

#define NCCL_PROTO_UNDEF -1
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2

/* A cost-table entry NCCL did not compute (disabled, unsupported, or turned off by NCCL_ALGO/NCCL_PROTO). */
#define NCCL_ALGO_PROTO_IGNORE -1.0

#define NCCL_NUM_ALGORITHMS_V5 7
#define NCCL_NUM_PROTOCOLS_V5 3
#define NCCL_NUM_HW_LINKS_V5 3
#define NCCL_NUM_COMPCAPS_V5 4
#define NCCL_NUM_TUNING_SCALES_V5 3

/* ---------------------------------------------------------------------------------------------------------
 * v1 (NCCL 2.19, 2.20): no context; loaded only from NCCL_TUNER_PLUGIN.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction);
  ncclResult_t (*getCollInfo)(ncclFunc_t collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)(void);
} ncclTuner_v1_t;

/* ---------------------------------------------------------------------------------------------------------
 * v2 (NCCL 2.21; still loaded by 2.22-2.30): a context per communicator; the plugin names algo and protocol.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v2_t;

/* ---------------------------------------------------------------------------------------------------------
 * v3 (NCCL 2.22, 2.23): the cost table (collCostTable points to numAlgo x numProto contiguous floats).
 * ------------------------------------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v3_t;

/* ---------------------------------------------------------------------------------------------------------
 * v4 (NCCL 2.24-2.27): v3 plus regBuff (the user buffers are registered, or captured in a graph that
 * registers them).
 * ------------------------------------------------------------------------------------------------------- */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

/* ---------------------------------------------------------------------------------------------------------
 * v5 (NCCL 2.28, 2.29): init takes the communicator id, the NVLink domain shape and NCCL's tuning constants
 * (which the plugin may edit before NCCL computes its model); destroy is called finalize.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

/* ---------------------------------------------------------------------------------------------------------
 * v6 (NCCL 2.30): v5 plus an optional getChunkSize (NULL: NCCL's chunk size).
 * ------------------------------------------------------------------------------------------------------- */
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v6_t* nvlDomainInfo, ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                               int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

#endif /* NCCL_TUNER_SWITCHLESS_H */
