/*
 * bare_cupti.c: "bare CUPTI", the floor that cuptistream's overhead is measured against.
 *
 * A minimal CUPTI activity client, loaded into a CUDA program through the driver's injection hook:
 *
 *     CUDA_INJECTION64_PATH=/path/bare_cupti.so NVTX_INJECTION64_PATH=/path/libcupti.so.13 \
 *     BARE_CUPTI_RUNTIME_CBIDS=211,... BARE_CUPTI_DRIVER_CBIDS=307,... BARE_CUPTI_OUT=out.json python ...
 *
 * At cuInit the driver calls InitializeInjection(), which
 *   - registers buffer callbacks: "requested" hands out malloc'd, 8-byte aligned 4 MiB buffers;
 *     "completed" walks every record with cuptiActivityGetNextRecord (counting them, per kind), reads
 *     the dropped count and frees the buffer. No other per-record work.
 *   - enables the kinds of cuptistream's default config (CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME,
 *     DRIVER, MARKER, EXTERNAL_CORRELATION);
 *   - THEN applies per-cbid API filters (set before cuptiActivityEnable, CUPTI silently loses them):
 *     every runtime cbid in [1, BARE_CUPTI_RUNTIME_MAX) (default CUPTI_RUNTIME_TRACE_CBID_SIZE of the
 *     headers this was built against) is disabled unless listed in BARE_CUPTI_RUNTIME_CBIDS
 *     (comma-separated); likewise for the driver with BARE_CUPTI_DRIVER_CBIDS / BARE_CUPTI_DRIVER_MAX.
 *     Unset list variables leave that domain unfiltered (every call traced).
 *   - starts a thread that calls cuptiActivityFlushAll(0) every second (as cuptistream's activity
 *     source does with flush_interval: 1s).
 * At exit (atexit) it stops the thread, calls cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)
 * and writes {"records": N, "dropped": M, "buffers": B, ...} to the file named by BARE_CUPTI_OUT
 * (stderr if unset).
 *
 * Build: gcc -O2 -shared -fPIC -I<cupti include> -I<cuda include> bare_cupti.c <libcupti.so.13>
 *        -Wl,-rpath,<its dir> -lpthread -o bare_cupti.so   (bench/overhead_gpu.py does this)
 */
#include <cupti_activity.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUF_SIZE (4u * 1024u * 1024u)
#define ALIGN 8u
#define MAX_KIND 128

static uint64_t g_records, g_dropped, g_buffers, g_bytes;
static uint64_t g_kind_records[MAX_KIND];
static uint64_t g_filter_errors;
static uint64_t g_runtime_enabled, g_driver_enabled;
static const char *g_errors[16];
static int g_nerrors;

static pthread_t g_flusher;
static int g_flusher_started;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_stop;
static int g_initialized;

static void note_error(const char *what, CUptiResult res) {
    const char *msg = "?";
    cuptiGetResultString(res, &msg);
    fprintf(stderr, "bare_cupti: %s failed: %s (%d)\n", what, msg, (int)res);
    if (g_nerrors < 16) g_errors[g_nerrors++] = what;
}

#define CHECK(call, what)                              \
    do {                                               \
        CUptiResult _r = (call);                       \
        if (_r != CUPTI_SUCCESS) note_error(what, _r); \
    } while (0)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, BUF_SIZE) != 0) p = NULL;
    *buffer = (uint8_t *)p;
    *size = p ? BUF_SIZE : 0;
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)size;
    uint64_t n = 0;
    uint64_t per_kind[MAX_KIND];
    memset(per_kind, 0, sizeof per_kind);
    CUpti_Activity *record = NULL;
    if (valid > 0) {
        for (;;) {
            CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &record);
            if (r != CUPTI_SUCCESS) break; /* CUPTI_ERROR_MAX_LIMIT_REACHED: end of buffer */
            n++;
            unsigned k = (unsigned)record->kind;
            per_kind[k < MAX_KIND ? k : 0]++;
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) != CUPTI_SUCCESS) dropped = 0;
    __atomic_fetch_add(&g_records, n, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_dropped, (uint64_t)dropped, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_buffers, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_bytes, (uint64_t)valid, __ATOMIC_RELAXED);
    for (unsigned k = 0; k < MAX_KIND; k++)
        if (per_kind[k]) __atomic_fetch_add(&g_kind_records[k], per_kind[k], __ATOMIC_RELAXED);
    free(buffer);
}

static void *flush_loop(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_lock);
    while (!g_stop) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 1;
        pthread_cond_timedwait(&g_cond, &g_lock, &deadline);
        if (g_stop) break;
        pthread_mutex_unlock(&g_lock);
        cuptiActivityFlushAll(0);
        pthread_mutex_lock(&g_lock);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

/* Parse a comma-separated list of cbids (lists are short: in_list scans them linearly). */
static int parse_list(const char *text, uint32_t *out, int cap) {
    int n = 0;
    const char *p = text;
    while (p && *p && n < cap) {
        char *end = NULL;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) { /* skip junk */
            p++;
            continue;
        }
        out[n++] = (uint32_t)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

static int in_list(uint32_t cbid, const uint32_t *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] == cbid) return 1;
    return 0;
}

static void apply_filter(const char *domain, const char *list_env, const char *max_env, uint32_t header_max,
                         CUptiResult (*fn)(CUpti_CallbackId, uint8_t), uint64_t *enabled_count) {
    const char *text = getenv(list_env);
    if (!text) {
        fprintf(stderr, "bare_cupti: %s unset: %s API unfiltered\n", list_env, domain);
        return;
    }
    static uint32_t list[4096];
    int n = parse_list(text, list, 4096);
    uint32_t max = header_max;
    const char *m = getenv(max_env);
    if (m && *m) max = (uint32_t)strtoul(m, NULL, 10);
    /* Disable everything first, then enable the selection: cbids CUPTI rejects (newer than this
     * libcupti) are counted, not fatal. */
    for (uint32_t cbid = 1; cbid < max; cbid++) {
        if (in_list(cbid, list, n)) continue;
        if (fn(cbid, 0) != CUPTI_SUCCESS) g_filter_errors++;
    }
    for (int i = 0; i < n; i++) {
        if (fn(list[i], 1) == CUPTI_SUCCESS)
            (*enabled_count)++;
        else
            g_filter_errors++;
    }
}

static void write_report(void) {
    const char *path = getenv("BARE_CUPTI_OUT");
    FILE *f = path && *path ? fopen(path, "w") : stderr;
    if (!f) {
        fprintf(stderr, "bare_cupti: cannot write %s\n", path);
        f = stderr;
    }
    fprintf(f,
            "{\"records\": %llu, \"dropped\": %llu, \"buffers\": %llu, \"bytes\": %llu, "
            "\"runtime_cbids_enabled\": %llu, \"driver_cbids_enabled\": %llu, \"filter_errors\": %llu, "
            "\"errors\": %d, \"records_by_kind\": {",
            (unsigned long long)g_records, (unsigned long long)g_dropped, (unsigned long long)g_buffers,
            (unsigned long long)g_bytes, (unsigned long long)g_runtime_enabled,
            (unsigned long long)g_driver_enabled, (unsigned long long)g_filter_errors, g_nerrors);
    int first = 1;
    for (unsigned k = 0; k < MAX_KIND; k++) {
        if (!g_kind_records[k]) continue;
        fprintf(f, "%s\"%u\": %llu", first ? "" : ", ", k, (unsigned long long)g_kind_records[k]);
        first = 0;
    }
    fprintf(f, "}}\n");
    if (f != stderr) fclose(f);
}

static void at_exit(void) {
    if (g_flusher_started) {
        pthread_mutex_lock(&g_lock);
        g_stop = 1;
        pthread_cond_signal(&g_cond);
        pthread_mutex_unlock(&g_lock);
        pthread_join(g_flusher, NULL);
    }
    CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll(FORCED)");
    write_report();
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
    if (g_initialized) return 1;
    g_initialized = 1;
    CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    static const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
        CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_MARKER,
        CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        CHECK(cuptiActivityEnable(kinds[i]), "cuptiActivityEnable");
    /* After cuptiActivityEnable(RUNTIME/DRIVER): per-cbid filters set before it are lost. */
    apply_filter("runtime", "BARE_CUPTI_RUNTIME_CBIDS", "BARE_CUPTI_RUNTIME_MAX",
                 (uint32_t)CUPTI_RUNTIME_TRACE_CBID_SIZE, cuptiActivityEnableRuntimeApi, &g_runtime_enabled);
    apply_filter("driver", "BARE_CUPTI_DRIVER_CBIDS", "BARE_CUPTI_DRIVER_MAX",
                 (uint32_t)CUPTI_DRIVER_TRACE_CBID_SIZE, cuptiActivityEnableDriverApi, &g_driver_enabled);
    if (pthread_create(&g_flusher, NULL, flush_loop, NULL) == 0) g_flusher_started = 1;
    atexit(at_exit);
    fprintf(stderr, "bare_cupti: enabled; runtime cbids %llu, driver cbids %llu, filter errors %llu\n",
            (unsigned long long)g_runtime_enabled, (unsigned long long)g_driver_enabled,
            (unsigned long long)g_filter_errors);
    return 1;
}
