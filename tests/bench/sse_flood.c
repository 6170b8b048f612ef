/*
 * sse-flood: holds many concurrent SSE completion streams against one HTTP
 * endpoint (pdgw or pdgw-sim) and measures what a relay adds per token.
 *
 * Every streamed chunk from `pdgw-sim --emit-timestamps` carries
 * "sim_emit_ns" (CLOCK_REALTIME when the simulator wrote it); the delay of a
 * token is the client's CLOCK_REALTIME at receipt minus that stamp. Both ends
 * run on one machine, so they share the clock.
 *
 * One epoll loop, non-blocking sockets, HTTP/1.1 with chunked decoding. With
 * --pid, the target's RSS and CPU time
 * (utime + stime) over the run is reported; the RSS is sampled every 100 ms and
 * the highest value is reported.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum stream_phase { PHASE_CONNECTING, PHASE_SENDING, PHASE_HEADERS, PHASE_BODY, PHASE_DONE };

typedef struct {
    int fd;
    enum stream_phase phase;
    size_t sent;
    char buf[16384];
    size_t len;
    long chunk_left; /* bytes left in the current HTTP chunk, -1 = reading a size line */
    char sse[8192];  /* de-chunked SSE bytes not yet split into events */
    size_t sse_len;
    int tokens;
    int failed;
} stream_t;

typedef struct {
    const char *host;
    int port;
    int streams;
    int tokens;
    const char *path;
    const char *model;
    double timeout_s;
    int pid;
    int ramp_per_tick;
} options_t;

static int64_t *g_delays;
static size_t g_ndelays, g_cap_delays;
static char g_request[2048];
static size_t g_request_len;

static int64_t now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void record_delay(int64_t d)
{
    if (g_ndelays == g_cap_delays) {
        g_cap_delays = g_cap_delays ? g_cap_delays * 2 : 1 << 20;
        g_delays = realloc(g_delays, g_cap_delays * sizeof(*g_delays));
        if (!g_delays) {
            perror("realloc");
            exit(2);
        }
    }
    g_delays[g_ndelays++] = d;
}

static long proc_rss_kib(int pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static double proc_cpu_seconds(int pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* Fields after the parenthesised command name: state is field 3, utime 14, stime 15. */
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    unsigned long utime = 0, stime = 0;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2)
        return -1;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* Splits complete SSE events out of s->sse; records a delay per stamped event. */
static void consume_sse(stream_t *s)
{
    size_t start = 0;
    for (;;) {
        char *end = memmem(s->sse + start, s->sse_len - start, "\n\n", 2);
        if (!end)
            break;
        size_t elen = (size_t)(end - (s->sse + start));
        char *ev = s->sse + start;
        if (elen >= 11 && memmem(ev, elen, "[DONE]", 6)) {
            s->phase = PHASE_DONE;
        } else {
            char *stamp = memmem(ev, elen, "\"sim_emit_ns\":", 14);
            if (stamp) {
                int64_t emitted = strtoll(stamp + 14, NULL, 10);
                record_delay(now_ns(CLOCK_REALTIME) - emitted);
            }
            if (memmem(ev, elen, "\"error\"", 7))
                s->failed = 1;
            s->tokens++;
        }
        start += elen + 2;
    }
    memmove(s->sse, s->sse + start, s->sse_len - start);
    s->sse_len -= start;
}

/* Decodes chunked transfer encoding from s->buf into s->sse. */
static int consume_body(stream_t *s)
{
    size_t pos = 0;
    while (pos < s->len && s->phase == PHASE_BODY) {
        if (s->chunk_left < 0) {
            char *nl = memchr(s->buf + pos, '\n', s->len - pos);
            if (!nl)
                break;
            long size = strtol(s->buf + pos, NULL, 16);
            pos = (size_t)(nl - s->buf) + 1;
            if (size == 0) {
                s->phase = PHASE_DONE;
                break;
            }
            s->chunk_left = size + 2; /* payload plus CRLF */
            continue;
        }
        size_t take = s->len - pos;
        if ((long)take > s->chunk_left)
            take = (size_t)s->chunk_left;
        size_t payload = take;
        if (s->chunk_left - (long)take < 2) /* part of the trailing CRLF */
            payload = take - (size_t)(2 - (s->chunk_left - (long)take));
        if (payload > sizeof(s->sse) - s->sse_len)
            return -1;
        memcpy(s->sse + s->sse_len, s->buf + pos, payload);
        s->sse_len += payload;
        s->chunk_left -= (long)take;
        pos += take;
        if (s->chunk_left == 0)
            s->chunk_left = -1;
        consume_sse(s);
    }
    memmove(s->buf, s->buf + pos, s->len - pos);
    s->len -= pos;
    return 0;
}

static int open_stream(const options_t *o, int ep, stream_t *s)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    inet_pton(AF_INET, o->host, &sa.sin_addr);
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s->fd < 0)
        return -1;
    int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(s->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
        close(s->fd);
        s->fd = -1;
        return -1;
    }
    s->phase = PHASE_CONNECTING;
    s->chunk_left = -1;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = s};
    return epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
}

static void finish(int ep, stream_t *s, int failed, int *open_count)
{
    if (s->fd >= 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
        close(s->fd);
        s->fd = -1;
        (*open_count)--;
    }
    s->failed |= failed;
    s->phase = PHASE_DONE;
}

static void on_event(int ep, stream_t *s, uint32_t events, int *open_count)
{
    if (events & (EPOLLERR | EPOLLHUP)) {
        if (!(events & EPOLLIN)) {
            finish(ep, s, s->phase != PHASE_DONE, open_count);
            return;
        }
    }
    if (s->phase == PHASE_CONNECTING || s->phase == PHASE_SENDING) {
        s->phase = PHASE_SENDING;
        ssize_t n = send(s->fd, g_request + s->sent, g_request_len - s->sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) {
            finish(ep, s, 1, open_count);
            return;
        }
        if (n > 0)
            s->sent += (size_t)n;
        if (s->sent == g_request_len) {
            s->phase = PHASE_HEADERS;
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
            epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
        }
        return;
    }
    for (;;) {
        ssize_t n = recv(s->fd, s->buf + s->len, sizeof(s->buf) - s->len, 0);
        if (n == 0) {
            finish(ep, s, s->phase != PHASE_DONE, open_count);
            return;
        }
        if (n < 0) {
            if (errno != EAGAIN)
                finish(ep, s, 1, open_count);
            return;
        }
        s->len += (size_t)n;
        if (s->phase == PHASE_HEADERS) {
            char *hend = memmem(s->buf, s->len, "\r\n\r\n", 4);
            if (!hend)
                continue;
            if (strncmp(s->buf, "HTTP/1.1 200", 12) != 0) {
                finish(ep, s, 1, open_count);
                return;
            }
            size_t hlen = (size_t)(hend - s->buf) + 4;
            memmove(s->buf, s->buf + hlen, s->len - hlen);
            s->len -= hlen;
            s->phase = PHASE_BODY;
        }
        if (consume_body(s) < 0) {
            finish(ep, s, 1, open_count);
            return;
        }
        if (s->phase == PHASE_DONE) {
            finish(ep, s, 0, open_count);
            return;
        }
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double pct_us(double p)
{
    if (!g_ndelays)
        return 0;
    size_t i = (size_t)(p * (double)(g_ndelays - 1));
    return (double)g_delays[i] / 1000.0;
}

static void usage(void)
{
    fprintf(stderr, "usage: sse-flood --port P [--host H] [--streams N] [--tokens T]\n"
                    "                 [--path /v1/completions] [--model M] [--timeout S]\n"
                    "                 [--pid PID] [--ramp N-per-ms]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    options_t o = {.host = "127.0.0.1",
                   .streams = 100,
                   .tokens = 256,
                   .path = "/v1/completions",
                   .model = "sim-model",
                   .timeout_s = 120,
                   .ramp_per_tick = 50};
    static const struct option longopts[] = {
        {"host", 1, 0, 'h'}, {"port", 1, 0, 'p'},  {"streams", 1, 0, 'n'}, {"tokens", 1, 0, 't'},
        {"path", 1, 0, 'P'}, {"model", 1, 0, 'm'}, {"timeout", 1, 0, 'T'}, {"pid", 1, 0, 'i'},
        {"ramp", 1, 0, 'r'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            o.host = optarg;
            break;
        case 'p':
            o.port = atoi(optarg);
            break;
        case 'n':
            o.streams = atoi(optarg);
            break;
        case 't':
            o.tokens = atoi(optarg);
            break;
        case 'P':
            o.path = optarg;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'T':
            o.timeout_s = atof(optarg);
            break;
        case 'i':
            o.pid = atoi(optarg);
            break;
        case 'r':
            o.ramp_per_tick = atoi(optarg);
            break;
        default:
            usage();
        }
    }
    if (o.port <= 0 || o.streams <= 0)
        usage();

    char body[512];
    int blen = snprintf(body, sizeof(body),
                        "{\"model\":\"%s\",\"prompt\":\"stream bench prompt\",\"max_tokens\":%d,"
                        "\"ignore_eos\":true,\"stream\":true}",
                        o.model, o.tokens);
    g_request_len =
        (size_t)snprintf(g_request, sizeof(g_request),
                         "POST %s HTTP/1.1\r\nHost: %s:%d\r\n"
                         "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                         "Content-Length: %d\r\n\r\n%s",
                         o.path, o.host, o.port, blen, body);

    stream_t *streams = calloc((size_t)o.streams, sizeof(*streams));
    int ep = epoll_create1(0);
    if (!streams || ep < 0) {
        perror("setup");
        return 2;
    }
    double cpu0 = o.pid ? proc_cpu_seconds(o.pid) : 0;
    int64_t t0 = now_ns(CLOCK_MONOTONIC);
    int64_t deadline = t0 + (int64_t)(o.timeout_s * 1e9);
    int opened = 0, open_count = 0, peak = 0, connect_failures = 0;
    long rss_at_peak = -1, rss_base = o.pid ? proc_rss_kib(o.pid) : -1;
    int64_t next_sample = t0;
    struct epoll_event evs[1024];

    while (now_ns(CLOCK_MONOTONIC) < deadline) {
        for (int k = 0; k < o.ramp_per_tick && opened < o.streams; k++, opened++) {
            streams[opened].fd = -1;
            if (open_stream(&o, ep, &streams[opened]) == 0)
                open_count++;
            else {
                streams[opened].failed = 1;
                streams[opened].phase = PHASE_DONE;
                connect_failures++;
            }
        }
        if (open_count > peak)
            peak = open_count;
        if (o.pid && now_ns(CLOCK_MONOTONIC) >= next_sample) {
            /* highest RSS seen while streams are open */
            long rss = proc_rss_kib(o.pid);
            if (rss > rss_at_peak)
                rss_at_peak = rss;
            next_sample = now_ns(CLOCK_MONOTONIC) + 100000000LL;
        }
        if (opened == o.streams && open_count == 0)
            break;
        int n = epoll_wait(ep, evs, 1024, 1);
        for (int i = 0; i < n; i++)
            on_event(ep, evs[i].data.ptr, evs[i].events, &open_count);
    }
    if (o.pid && rss_at_peak < 0)
        rss_at_peak = proc_rss_kib(o.pid);
    double elapsed = (double)(now_ns(CLOCK_MONOTONIC) - t0) / 1e9;
    double cpu = o.pid ? proc_cpu_seconds(o.pid) - cpu0 : 0;

    int completed = 0, failed = 0;
    long tokens = 0;
    for (int i = 0; i < o.streams; i++) {
        if (streams[i].fd >= 0)
            streams[i].failed = 1; /* still open at the deadline */
        if (streams[i].failed)
            failed++;
        else
            completed++;
        tokens += streams[i].tokens;
    }
    qsort(g_delays, g_ndelays, sizeof(*g_delays), cmp_i64);
    /* One machine-readable line for scripts, then a human summary. */
    printf("RESULT streams=%d completed=%d failed=%d peak_concurrent=%d tokens=%ld "
           "elapsed_s=%.2f delay_p50_us=%.1f delay_p99_us=%.1f delay_max_us=%.1f "
           "rss_base_kib=%ld rss_peak_kib=%ld cpu_s=%.2f\n",
           o.streams, completed, failed, peak, tokens, elapsed, pct_us(0.50), pct_us(0.99),
           pct_us(1.0), rss_base, rss_at_peak, cpu);
    fprintf(stderr,
            "%d/%d streams completed (%d connect failures), peak %d concurrent, %ld tokens in "
            "%.1fs; per-token delay p50 %.1f us, p99 %.1f us\n",
            completed, o.streams, connect_failures, peak, tokens, elapsed, pct_us(0.50),
            pct_us(0.99));
    free(streams);
    free(g_delays);
    close(ep);
    return failed ? 1 : 0;
}
