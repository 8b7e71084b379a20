/* LD_PRELOAD helper for diagnosing an abort at exit: on SIGABRT, print the native stack (exported
 * symbols only) to stderr, then die as before. Build: gcc -shared -fPIC -o bt.so abort_backtrace.c */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_abort(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    static const char head[] = "== native stack at SIGABRT ==\n";
    write(2, head, sizeof(head) - 1);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* load libgcc's unwinder now, not inside the handler */
    signal(SIGABRT, on_abort);
}
