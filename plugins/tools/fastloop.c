/*
 * The telemetry sampler's compiled fast loop (rackbench, runners/tools/sampler.py builds and runs it).
 *
 *     fastloop INTERVAL_NS BATCH_NS FD...
 *
 * Every INTERVAL_NS it reads one counter (a decimal number) from each FD, already open (inherited from the sampler),
 * with pread at offset 0, and appends a record to its output: the CLOCK_REALTIME time of the tick in ns, then each
 * counter, all native int64. A tick where any read fails records -1 for every counter (the sampler's "missing").
 * Records go to stdout (a pipe to the sampler) in batches: the first record at once, then every BATCH_NS. It keeps
 * its cadence by sleeping to absolute CLOCK_MONOTONIC deadlines; ticks it missed are skipped, not caught up.
 *
 * It ends on SIGTERM or SIGINT (writing what it holds first) and when its output is closed (the sampler is gone).
 * Exit status: 0, 2 for bad arguments, 1 when the output cannot be written.
 *
 * Why C: at a 1 ms interval the Python loop's own work per wake-up is about as large as the reads it does (the
 * figures are in bench/sampler_overhead.py's output); this loop only sleeps, reads and copies.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stopping = 0;

static void on_signal(int signum) {
    (void)signum;
    stopping = 1;
}

static int parse_whole(const char *text, long long *out) {
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0' || value < 0)
        return -1;
    *out = value;
    return 0;
}

static int write_all(const char *data, size_t size) {
    while (size) {
        ssize_t done = write(STDOUT_FILENO, data, size);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += done;
        size -= (size_t)done;
    }
    return 0;
}

static int64_t ns_of(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec; }

static struct timespec timespec_of(int64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    return t;
}

/* One counter: the number at the start of the file, up to its newline. */
static int read_counter(int fd, int64_t *value) {
    char text[32];
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    if (got <= 0)
        return -1;
    text[got] = '\0';
    char *newline = memchr(text, '\n', (size_t)got);
    if (newline)
        *newline = '\0';
    long long parsed;
    if (parse_whole(text, &parsed))
        return -1;
    *value = parsed;
    return 0;
}

int main(int argc, char **argv) {
    long long interval, batch;
    if (argc < 4 || parse_whole(argv[1], &interval) || parse_whole(argv[2], &batch) || interval < 1) {
        static const char usage[] = "usage: fastloop INTERVAL_NS BATCH_NS FD...\n";
        (void)!write(STDERR_FILENO, usage, sizeof usage - 1);
        return 2;
    }
    int count = argc - 3;
    size_t width = (size_t)(count + 1);
    size_t rows = (size_t)(batch / interval) + 2; /* a batch's records, and room for a late tick */
    int *fds = calloc((size_t)count, sizeof *fds);
    int64_t *records = calloc(rows * width, sizeof *records);
    if (!fds || !records)
        return 1;
    for (int i = 0; i < count; i++) {
        long long fd;
        if (parse_whole(argv[3 + i], &fd))
            return 2;
        fds[i] = (int)fd;
    }

    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);

    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t next_tick = ns_of(&now), written_at = next_tick;
    size_t held = 0;
    int first = 1;
    while (!stopping) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t mono = ns_of(&now);
        if (mono < next_tick) {
            struct timespec deadline = timespec_of(next_tick);
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL); /* a signal ends it early */
            continue;
        }
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        int64_t *record = records + held * width;
        record[0] = ns_of(&wall);
        for (int i = 0; i < count; i++) {
            if (read_counter(fds[i], &record[1 + i])) {
                for (int j = 0; j < count; j++)
                    record[1 + j] = -1;
                break;
            }
        }
        held++;
        next_tick += interval;
        if (next_tick <= mono) /* late by a whole interval or more: skip the ticks missed, keep the phase */
            next_tick += ((mono - next_tick) / interval + 1) * interval;
        if (first || mono - written_at >= batch || held == rows) {
            if (write_all((const char *)records, held * width * sizeof *records))
                return 1;
            held = 0;
            written_at = mono;
            first = 0;
        }
    }
    return write_all((const char *)records, held * width * sizeof *records) ? 1 : 0;
}
