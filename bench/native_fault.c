/* Where a native crash happened: a SIGSEGV/SIGBUS/SIGABRT handler, LD_PRELOADed into a GPU run, that
 * writes the faulting thread's id and name and its native stack (library, symbol, offset) to stderr,
 * then lets the signal kill the process as before.
 *
 * Why: a DDP rank under production.yaml died of SIGSEGV on a thread with no Python state (2026-11-28,
 * H200 x2), so PYTHONFAULTHANDLER named no culprit. Python's faulthandler, installed after this one,
 * dumps the Python stacks first and then re-raises the signal into this handler on the same thread;
 * the unwinder walks through both signal frames to the faulting code.
 *
 *   gcc -O1 -g -shared -fPIC -o /tmp/native_fault.so bench/native_fault.c
 *   LD_PRELOAD=/tmp/native_fault.so python bench/budget_lost_time.py ...
 *
 * The device scripts' setup (bench/device_lib.sh) builds and preloads it unless NATIVE_FAULTS=0.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static char alt_stack[1 << 16];

static void say(const char *text) {
    ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
    (void)ignored;
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    (void)context;
    char name[32] = "?", line[256];
    prctl(PR_GET_NAME, name, 0, 0, 0);
    snprintf(line, sizeof line, "native_fault: signal %d (code %d, address %p) on thread %ld \"%s\"; stack:\n",
             sig, info->si_code, info->si_addr, (long)syscall(SYS_gettid), name);
    say(line);
    void *frames[96];
    int depth = backtrace(frames, 96);
    backtrace_symbols_fd(frames, depth, STDERR_FILENO);
    say("native_fault: end of stack\n");
    signal(sig, SIG_DFL);  /* returning re-runs the faulting instruction, now fatal */
    if (sig == SIGABRT) raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc's unwinder now, not inside a signal handler */
    stack_t stack = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack};
    sigaltstack(&stack, NULL);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, NULL);
    sigaction(SIGBUS, &action, NULL);
    sigaction(SIGABRT, &action, NULL);
}
