// launch_cost.cu: what each piece of CUPTI that cuptistream holds between budget windows costs one
// kernel launch, toggled inside one process (issue 26; bench/launch_cost.py builds and runs it).
//
//     launch_cost MODE [PHASES] [PHASE_SECONDS]
//
// MODE is the piece switched on and off every PHASE_SECONDS (default 0.25 s), PHASES times
// (default 80), starting off:
//   none       nothing (the method's null)
//   subscribe  cuptiSubscribe with no domain enabled / cuptiUnsubscribe
//   state      a subscriber throughout; its STATE domain enabled / disabled (the state source)
//   attach     the activity API attached with nothing traced (buffer callbacks registered, one
//              kind enabled and disabled at once: CUPTI between two windows) / cuptiFinalize
// A phase launches an empty kernel in batches of 512 (under the launch queue's depth, so the
// timed loop is the launching thread's own cost), synchronizing after each batch; its value is the
// median ns per launch over its batches, the first batch after a toggle left out. Prints one JSON
// line: each phase's state and value.
#include <cuda_runtime.h>
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 512
#define MAX_BATCHES 4096

__global__ void empty_kernel() {}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(CUptiResult res, const char *what) {
    if (res != CUPTI_SUCCESS) {
        const char *msg = "?";
        cuptiGetResultString(res, &msg);
        fprintf(stderr, "launch_cost: %s: %s\n", what, msg);
        exit(3);
    }
}

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *data) {
    (void)userdata, (void)domain, (void)cbid, (void)data;
}

static void CUPTIAPI on_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 1 << 20;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI on_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                  size_t valid) {
    (void)ctx, (void)stream, (void)size, (void)valid;
    free(buffer);
}

static CUpti_SubscriberHandle subscriber;
static int subscribed, attached;

static void set_piece(const char *mode, int on) {
    if (!strcmp(mode, "subscribe")) {
        if (on) {
            check(cuptiSubscribe(&subscriber, on_callback, NULL), "cuptiSubscribe");
            subscribed = 1;
        } else if (subscribed) {
            check(cuptiUnsubscribe(subscriber), "cuptiUnsubscribe");
            subscribed = 0;
        }
    } else if (!strcmp(mode, "state")) {
        check(cuptiEnableDomain(on, subscriber, CUPTI_CB_DOMAIN_STATE), "cuptiEnableDomain");
    } else if (!strcmp(mode, "attach")) {
        if (on) {
            check(cuptiActivityRegisterCallbacks(on_requested, on_completed), "cuptiActivityRegisterCallbacks");
            check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
            check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
            attached = 1;
        } else if (attached) {
            check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
            check(cuptiFinalize(), "cuptiFinalize");
            attached = 0;
        }
    }
}

static double batch_ns(void) {
    double t0 = now_s();
    for (int i = 0; i < BATCH; i++) empty_kernel<<<1, 1>>>();
    double t1 = now_s();
    cudaDeviceSynchronize();
    return (t1 - t0) * 1e9 / BATCH;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double phase_ns(double seconds) {
    static double values[MAX_BATCHES];
    int n = 0;
    batch_ns();  // the batch the toggle fell in
    double end = now_s() + seconds;
    while (now_s() < end && n < MAX_BATCHES) values[n++] = batch_ns();
    qsort(values, n, sizeof(double), by_value);
    return values[n / 2];
}

int main(int argc, char **argv) {
    const char *modes[] = {"none", "subscribe", "state", "attach"};
    const char *mode = argc > 1 ? argv[1] : "";
    int known = 0;
    for (unsigned i = 0; i < sizeof modes / sizeof *modes; i++) known |= !strcmp(mode, modes[i]);
    if (!known) {
        fprintf(stderr, "usage: launch_cost none|subscribe|state|attach [PHASES] [PHASE_SECONDS]\n");
        return 2;
    }
    int phases = argc > 2 ? atoi(argv[2]) : 80;
    double seconds = argc > 3 ? atof(argv[3]) : 0.25;
    if (cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "launch_cost: no CUDA device\n");
        return 3;
    }
    phase_ns(1.0);  // warm-up: module load, first launches
    if (!strcmp(mode, "state")) {
        check(cuptiSubscribe(&subscriber, on_callback, NULL), "cuptiSubscribe");
        subscribed = 1;
    }
    printf("{\"mode\": \"%s\", \"batch\": %d, \"phases\": [", mode, BATCH);
    for (int p = 0; p < phases; p++) {
        int on = p % 2;
        set_piece(mode, on);
        printf("%s[%d, %.2f]", p ? ", " : "", on, phase_ns(seconds));
    }
    set_piece(mode, 0);
    printf("]}\n");
    return 0;
}
