/*
 * KV-event sockets are bounded (scheduler/src/sched_kvev_sub.c: ZMQ_MAXMSGSIZE on the SUB and
 * on the replay DEALER). A publisher that sends a 64 MiB frame, live or as a replay answer,
 * does not make the subscriber allocate it: this process's peak RSS stays flat. ZeroMQ drops
 * that connection instead; the subscriber counts it (reconnects), opens its sockets again,
 * and ordinary events still arrive afterwards.
 *
 * The publisher is a child process (fork), so its own 64 MiB buffers are not in our RSS. It
 * speaks as vLLM's ZmqEventPublisher does (vllm-project/vllm vllm/distributed/kv_events.py):
 * live messages [topic, seq as 8-byte big-endian, msgpack batch] on a PUB; a replay ROUTER
 * that takes [id, "", start seq] and answers [id, "", seq, batch] ... [id, "", -1, ""].
 * Peak RSS is VmHWM of /proc/self/status, reset through /proc/self/clear_refs ("5") before
 * each measurement; a control allocation of 64 MiB shows the measurement sees such a frame.
 */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#include "pdb/pdb_clock.h"
#include "sched_kvev_int.h"
#include "sched_test_util.h"

#define HUGE_BYTES  ((size_t)64 << 20)
#define FLAT_KIB    (16 * 1024) /* growth allowed: well under the 64 MiB of one frame */
#define DEADLINE_MS 20000

/* ---- the publisher (child process) --------------------------------- */

static void pub_batch(msgpack_sbuffer *sb, uint64_t seq)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    /* {ts, events: [{type: BlockStored, ...}], data_parallel_rank} (current vLLM's layout) */
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "ts", 2);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_str_with_body(&pk, "events", 6);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 5);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "BlockStored", 11);
    msgpack_pack_str_with_body(&pk, "block_hashes", 12);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint64(&pk, seq + 1);
    msgpack_pack_str_with_body(&pk, "parent_block_hash", 17);
    msgpack_pack_nil(&pk);
    msgpack_pack_str_with_body(&pk, "token_ids", 9);
    msgpack_pack_array(&pk, 4);
    for (uint32_t k = 0; k < 4; k++)
        msgpack_pack_uint32(&pk, (uint32_t)seq * 4 + k);
    msgpack_pack_str_with_body(&pk, "block_size", 10);
    msgpack_pack_uint32(&pk, 4);
    msgpack_pack_str_with_body(&pk, "data_parallel_rank", 18);
    msgpack_pack_int(&pk, 0);
}

static void be64_put(unsigned char out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (56 - 8 * i));
}

/* The last PUB_KEEP batches published, as the engine's replay buffer keeps them (a ring of
 * buffer_steps batches; the huge frames are no batches and are not kept). */
#define PUB_KEEP 4096
typedef struct pub_buf {
    msgpack_sbuffer batch[PUB_KEEP];
    uint64_t seq_of[PUB_KEEP]; /* seq + 1 of the batch in that slot; 0: none */
} pub_buf_t;

/* Answer one replay request: [id, "", start] → the 64 MiB frame when armed, else the kept
 * batches from start on; then the end, [id, "", -1, ""]. */
static void pub_serve_replay(void *router, bool *huge_armed, const void *huge, pub_buf_t *buf,
                             uint64_t next_seq)
{
    unsigned char id[256], start[8], seq[8];
    int idn = zmq_recv(router, id, sizeof(id), 0), more = 1, part = 0;
    size_t sz = sizeof(more);
    uint64_t from = UINT64_MAX;

    zmq_getsockopt(router, ZMQ_RCVMORE, &more, &sz);
    while (more) {
        int n = zmq_recv(router, start, sizeof(start), 0);
        if (++part == 2 && n == 8) {
            from = 0;
            for (int i = 0; i < 8; i++)
                from = (from << 8) | start[i];
        }
        zmq_getsockopt(router, ZMQ_RCVMORE, &more, &sz);
    }
    if (idn <= 0)
        return;
    if (*huge_armed) {
        *huge_armed = false;
        be64_put(seq, from);
        zmq_send(router, id, (size_t)idn, ZMQ_SNDMORE);
        zmq_send(router, "", 0, ZMQ_SNDMORE);
        zmq_send(router, seq, 8, ZMQ_SNDMORE);
        zmq_send(router, huge, HUGE_BYTES, 0);
    } else {
        uint64_t oldest = next_seq > PUB_KEEP ? next_seq - PUB_KEEP : 0;
        for (uint64_t s = from > oldest ? from : oldest; s < next_seq; s++) {
            const msgpack_sbuffer *b = &buf->batch[s % PUB_KEEP];
            if (buf->seq_of[s % PUB_KEEP] != s + 1)
                continue;
            be64_put(seq, s);
            zmq_send(router, id, (size_t)idn, ZMQ_SNDMORE);
            zmq_send(router, "", 0, ZMQ_SNDMORE);
            zmq_send(router, seq, 8, ZMQ_SNDMORE);
            zmq_send(router, b->data, b->size, 0);
        }
    }
    memset(seq, 0xff, 8);
    zmq_send(router, id, (size_t)idn, ZMQ_SNDMORE);
    zmq_send(router, "", 0, ZMQ_SNDMORE);
    zmq_send(router, seq, 8, ZMQ_SNDMORE);
    zmq_send(router, "", 0, 0);
}

/*
 * Commands, one byte each on <cmd>: 'e' publish the next event, 'H' publish a 64 MiB frame
 * (as the next seq), 'R' answer the next replay request with a 64 MiB frame instead of the
 * batches (acknowledged with 'r' on <report>). EOF: exit.
 */
static void pub_main(int cmd, int report)
{
    void *ctx = zmq_ctx_new(), *pub = zmq_socket(ctx, ZMQ_PUB), *router;
    char ep[2][64], line[160];
    size_t sz;
    uint64_t seq = 0;
    bool huge_armed = false;
    unsigned char *huge = malloc(HUGE_BYTES);
    pub_buf_t *buf = calloc(1, sizeof(*buf));
    int zero = 0;

    router = zmq_socket(ctx, ZMQ_ROUTER);
    if (!huge || !buf || zmq_bind(pub, "tcp://127.0.0.1:*") != 0 ||
        zmq_bind(router, "tcp://127.0.0.1:*") != 0)
        _exit(2);
    memset(huge, 0xa5, HUGE_BYTES);
    sz = sizeof(ep[0]);
    zmq_getsockopt(pub, ZMQ_LAST_ENDPOINT, ep[0], &sz);
    sz = sizeof(ep[1]);
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep[1], &sz);
    snprintf(line, sizeof(line), "%s %s\n", ep[0], ep[1]);
    if (write(report, line, strlen(line)) < 0)
        _exit(2);
    for (;;) {
        zmq_pollitem_t it[2] = {{.socket = router, .events = ZMQ_POLLIN},
                                {.fd = cmd, .events = ZMQ_POLLIN}};
        unsigned char c, s8[8];
        if (zmq_poll(it, 2, -1) < 0 && errno != EINTR)
            break;
        if (it[0].revents & ZMQ_POLLIN)
            pub_serve_replay(router, &huge_armed, huge, buf, seq);
        if (!(it[1].revents & ZMQ_POLLIN))
            continue;
        if (read(cmd, &c, 1) != 1)
            break;
        if (c == 'R') {
            huge_armed = true;
            if (write(report, "r", 1) != 1)
                break;
            continue;
        }
        be64_put(s8, seq++);
        zmq_send(pub, "kv", 2, ZMQ_SNDMORE);
        zmq_send(pub, s8, 8, ZMQ_SNDMORE);
        if (c == 'H') {
            zmq_send(pub, huge, HUGE_BYTES, 0);
        } else {
            msgpack_sbuffer *b = &buf->batch[(seq - 1) % PUB_KEEP];
            if (buf->seq_of[(seq - 1) % PUB_KEEP] != 0)
                msgpack_sbuffer_destroy(b);
            pub_batch(b, seq - 1);
            buf->seq_of[(seq - 1) % PUB_KEEP] = seq;
            zmq_send(pub, b->data, b->size, 0);
        }
    }
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(pub);
    zmq_close(router);
    zmq_ctx_term(ctx);
    free(huge);
    _exit(0);
}

/* ---- the subscriber side (this process) ----------------------------- */

static pid_t child = -1;
static int cmd_fd = -1, report_fd = -1;

static int teardown(void **state)
{
    (void)state;
    if (cmd_fd >= 0)
        close(cmd_fd); /* the child exits on EOF */
    if (report_fd >= 0)
        close(report_fd);
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    child = -1;
    cmd_fd = report_fd = -1;
    return 0;
}

static void pub_start(char *pub_ep, char *router_ep)
{
    int cmd[2], rep[2];
    char line[160];
    ssize_t n;

    signal(SIGPIPE, SIG_IGN); /* a publisher that died fails pub_cmd(), not the whole run */
    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(rep), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(cmd[1]);
        close(rep[0]);
        pub_main(cmd[0], rep[1]);
    }
    close(cmd[0]);
    close(rep[1]);
    cmd_fd = cmd[1];
    report_fd = rep[0];
    n = read(report_fd, line, sizeof(line) - 1);
    assert_true(n > 0);
    line[n] = '\0';
    assert_int_equal(sscanf(line, "%63s %63s", pub_ep, router_ep), 2);
}

static void pub_cmd(char c)
{
    assert_int_equal(write(cmd_fd, &c, 1), 1);
}

/* Arm the 64 MiB replay answer and wait until the publisher has. */
static void pub_arm_huge_replay(void)
{
    char c = 0;
    pub_cmd('R');
    assert_int_equal(read(report_fd, &c, 1), 1);
    assert_int_equal(c, 'r');
}

/* Peak RSS since the last peak_reset(), in KiB. */
static long peak_kib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
            break;
    fclose(f);
    assert_true(kib > 0);
    return kib;
}

static void peak_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    assert_non_null(f);
    assert_true(fputs("5", f) >= 0);
    assert_int_equal(fclose(f), 0);
}

static void fail_stats(const char *what, sched_kvev_sub_t *sub)
{
    sched_kvev_sub_stats_t st;
    sched_kvev_sub_stats(sub, &st);
    fail_msg("%s within %d ms: events %llu, batches %llu, bad %llu, reconnects %llu, gaps %llu, "
             "replays %llu/%llu done/%llu failed",
             what, DEADLINE_MS, (unsigned long long)st.events, (unsigned long long)st.messages,
             (unsigned long long)st.bad_messages, (unsigned long long)st.reconnects,
             (unsigned long long)st.gaps, (unsigned long long)st.replays,
             (unsigned long long)st.replays_done, (unsigned long long)st.replay_failed);
}

/* Whether the huge frames are behind us: they dropped <drops> connections (bound), or one
 * was taken and refused as malformed (no bound); with <drops> 0, whether events came. */
static bool past(const sched_kvev_sub_stats_t *now, const sched_kvev_sub_stats_t *was,
                 uint64_t drops)
{
    if (drops == 0)
        return now->events > was->events;
    return now->reconnects >= was->reconnects + drops || now->bad_messages > was->bad_messages;
}

/* Have the publisher send events until past(); each poll waits at most 20 ms. */
static void publish_until(sched_kvev_sub_t *sub, const sched_kvev_sub_stats_t *was, uint64_t drops,
                          const char *what)
{
    uint64_t end = pdb_clock_mono_ms() + DEADLINE_MS;
    sched_kvev_sub_stats_t st;
    while (pdb_clock_mono_ms() < end) {
        pub_cmd('e'); /* a SUB joins asynchronously: what is sent before it is lost */
        sched_kvev_sub_poll(sub, 20);
        sched_kvev_sub_stats(sub, &st);
        if (past(&st, was, drops))
            return;
    }
    fail_stats(what, sub);
}

/* The subscriber gets past the frame(s) just sent (<drops> connections dropped, see past()),
 * then events arrive again: every one counted from here came over a new connection. */
static void through_huge(sched_kvev_sub_t *sub, uint64_t drops, const char *what)
{
    sched_kvev_sub_stats_t was;
    sched_kvev_sub_stats(sub, &was);
    publish_until(sub, &was, drops, what);
    sched_kvev_sub_stats(sub, &was);
    publish_until(sub, &was, 0, "events did not resume");
}

static void test_huge_frames(void **state)
{
    char pub_ep[64], router_ep[64];
    sched_kvev_index_t *idx;
    sched_kvev_sub_t *sub;
    sched_kvev_sub_stats_t was, st;
    unsigned char *control;
    long base;

    (void)state;
    pub_start(pub_ep, router_ep);

    /* The measurement sees 64 MiB touched once and released at once, as a frame would be. */
    peak_reset();
    base = peak_kib();
    control = malloc(HUGE_BYTES);
    assert_non_null(control);
    for (size_t i = 0; i < HUGE_BYTES; i += 4096)
        ((volatile unsigned char *)control)[i] = 1; /* touched, not optimised away */
    free(control);
    assert_true(peak_kib() - base >= (long)(HUGE_BYTES >> 10) - 1024);

    /* Replay: a new subscriber asks the replay ROUTER for everything from seq 0 as it joins;
     * the answer is a 64 MiB frame on the DEALER. No other replay is in flight then. */
    assert_int_equal(sched_kvev_index_create(1000, &idx), SCHED_OK);
    assert_int_equal(sched_kvev_sub_create(idx, 0, test_quiet_log, NULL, &sub), SCHED_OK);
    sched_kvev_sub_set_timing(sub, 1000, -1);
    pub_arm_huge_replay();
    peak_reset();
    base = peak_kib();
    assert_int_equal(sched_kvev_sub_add(sub, 1, pub_ep, router_ep), SCHED_OK);
    memset(&was, 0, sizeof(was));
    through_huge(sub, 1, "the replayed frame neither dropped the DEALER nor arrived");
    assert_true(peak_kib() - base < FLAT_KIB);
    sched_kvev_sub_stats(sub, &st);
    assert_int_equal(st.reconnects, 1);
    assert_int_equal(st.bad_messages, 0);

    /* Live: three 64 MiB frames on the SUB, one after another. */
    sched_kvev_sub_stats(sub, &was);
    peak_reset();
    base = peak_kib();
    for (int i = 0; i < 3; i++) {
        pub_cmd('H');
        through_huge(sub, 1, "the live frame neither dropped the SUB nor arrived");
    }
    assert_true(peak_kib() - base < FLAT_KIB);
    sched_kvev_sub_stats(sub, &st);
    assert_int_equal(st.reconnects, was.reconnects + 3);
    assert_int_equal(st.bad_messages, was.bad_messages);
    assert_true(st.events > was.events);

    sched_kvev_sub_destroy(sub);
    sched_kvev_index_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_huge_frames, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
